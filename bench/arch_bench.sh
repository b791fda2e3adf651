#!/usr/bin/env bash
# What the -march of our own code costs: the same measurements on several
# builds of pstrain, interleaved round by round so that a noisy machine
# treats every build alike, then the median of each build.
#   1. LeNet training, one epoch of MNIST, --kv-store local, batch 64
#      (samples/s = examples in the epoch / the epoch's "Time cost");
#   2. nn_step_bench: one LeNet training step on synthetic data, batch 64;
#   3. kvbench 16 x 1 MB on 1 server + 1 worker (pushpull, sync, async):
#      the servers' optimizer loops and the copies into and out of the arena.
#
#   cmake -S . -B /tmp/arch-v2 -DPSTRAIN_ARCH=x86-64-v2 -DPSTRAIN_BUILD_TESTS=OFF
#   cmake --build /tmp/arch-v2 --target pstrain nn_step_bench    # likewise other builds
#   bash bench/arch_bench.sh [-r ROUNDS] [-d MNIST_DIR] /tmp/arch-v2 /tmp/arch-native ...
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=5
MNIST=datasets/mnist
while [[ $# -gt 0 ]]; do
  case "$1" in
    -r) ROUNDS=$2; shift 2 ;;
    -d) MNIST=$2; shift 2 ;;
    *) break ;;
  esac
done
[[ $# -gt 0 ]] || { echo "usage: $0 [-r ROUNDS] [-d MNIST_DIR] BUILD_DIR..." >&2; exit 2; }
for b in "$@"; do
  for f in "$b/pstrain" "$b/bench/nn_step_bench"; do
    [[ -x $f ]] || { echo "arch_bench: $f is missing (build pstrain and nn_step_bench)" >&2; exit 2; }
  done
done
[[ -f $MNIST/train-images-idx3-ubyte.gz ]] ||
  { echo "arch_bench: no MNIST in $MNIST (-d DIR, or fetch it: build/pstrain data get mnist)" >&2; exit 2; }

# A build's row: its folder and its -march ("build-x/x86-64-v2").
Name() {
  local arch
  arch=$(grep -m1 '^PSTRAIN_ARCH:' "$1/CMakeCache.txt" | cut -d= -f2)
  echo "$(basename "$1")/${arch:-default}"
}

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
port=${ARCH_BENCH_PORT:-29700}
for ((r = 1; r <= ROUNDS; r++)); do
  for b in "$@"; do
    name=$(Name "$b")
    log=$out/train.log
    "$b/pstrain" train --network lenet --data-dir "$MNIST" --num-epochs 1 --kv-store local \
      --batch-size 64 --lr 0.05 --disp-batches 1000 >"$log" 2>&1
    batches=$(grep -o '[0-9]* batches per epoch' "$log" | cut -d' ' -f1)
    secs=$(grep -o 'Time cost=[0-9.]*' "$log" | cut -d= -f2)
    echo "$name train $(awk -v b="$batches" -v s="$secs" 'BEGIN { printf "%.1f", b * 64 / s }')" \
      >>"$out/rows"
    step=$("$b/bench/nn_step_bench" --network lenet --batch 64 2>/dev/null |
      awk -F'|' '$2 ~ /lenet/ { gsub(/ /, "", $8); print $8 }')
    echo "$name step $step" >>"$out/rows"
    PSTRAIN_BIN=$b/pstrain bash scripts/local_cluster.sh -s 1 -w 1 -p "$port" -- kvbench \
      --mode pushpull,sync,async --tensor-bytes 1048576 --tensors 16 --iters 600 2>&1 |
      awk -v n="$name" '/^kvbench: / { for (i = 2; i <= NF; i++) { split($i, kv, "=");
        v[kv[1]] = kv[2] } print n, "kv_" v["mode"], v["payload_gbps"] }' >>"$out/rows"
    port=$((port + 1))
    echo "round $r/$ROUNDS: $name done" >&2
  done
done

echo "| build/-march | LeNet train samples/s | LeNet step samples/s | kvbench 1 MB pushpull GB/s | sync GB/s | async GB/s |"
echo "|---|---:|---:|---:|---:|---:|"
for b in "$@"; do
  name=$(Name "$b")
  row="| $name"
  for m in train step kv_pushpull kv_sync kv_async; do
    # median (min-max)
    cell=$(awk -v n="$name" -v m="$m" '$1 == n && $2 == m { print $3 }' "$out/rows" | sort -g |
      awk '{ a[NR] = $1 } END { if (NR == 0) { print "-"; exit }
        med = NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2
        f = med >= 100 ? "%.0f (%.0f-%.0f)" : "%.2f (%.2f-%.2f)"; printf f "\n", med, a[1], a[NR] }')
    row+=" | $cell"
  done
  echo "$row |"
done
echo "(median (min-max) of $ROUNDS interleaved rounds; $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))"
