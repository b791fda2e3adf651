#!/usr/bin/env bash
# One training step on GPU 0, pstrain (bench/nn_step_bench --gpus 0) beside
# PyTorch eager with cuDNN benchmark mode (bench/torch_step_bench.py, the
# same networks in bench/torch_models.py), interleaved round by round:
# samples/s (median of the rounds) and peak device memory. The rows are the
# seeds' single-GPU figures (issue 10): LeNet (seed 000), inception-bn-28-small
# on 28x28 CIFAR (seed 001), ResNet-50 and Inception-v3 (seed 003), the neon
# CIFAR-10 conv net (seed 004).
#   bash bench/gpu_vs_pytorch.sh [build_dir] [rounds]     # PYTHON=python3 by default
#   (NN_STEP_BENCH=path/to/nn_step_bench where it is not build_dir/bench/, a bundle say)
set -euo pipefail
BUILD=${1:-build}
ROUNDS=${2:-3}
PY=${PYTHON:-python3}
cd "$(dirname "$0")/.."
# network batch image-shape classes layers steps
ROWS=(
  "lenet 128 1,28,28 10 0 200"
  "lenet 512 1,28,28 10 0 100"
  "inception-bn-28-small 128 3,28,28 10 0 50"
  "inception-bn-28-small 256 3,28,28 10 0 30"
  "resnet 32 3,224,224 1000 50 30"
  "inception-v3 32 3,299,299 1000 0 20"
  "neon-cifar10-conv 128 3,32,32 10 0 200"
)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for ((r = 1; r <= ROUNDS; r++)); do
  for i in "${!ROWS[@]}"; do
    read -r net batch shape classes layers steps <<<"${ROWS[$i]}"
    common=(--network "$net" --batch "$batch" --image-shape "$shape" --num-classes "$classes"
            --num-layers "$layers" --steps "$steps")
    "${NN_STEP_BENCH:-$BUILD/bench/nn_step_bench}" "${common[@]}" --gpus 0 >"$out/p" 2>&1 ||
      { cat "$out/p" >&2; exit 1; }
    "$PY" bench/torch_step_bench.py "${common[@]}" --device cuda >"$out/t" 2>&1 ||
      { cat "$out/t" >&2; exit 1; }
    awk -F'|' 'NR == 3 { gsub(/ /, "", $8); print $8 }' "$out/p" >>"$out/p$i.sps"
    awk -F'|' '/^\| / { gsub(/ /, "", $8); print $8 }' "$out/t" >>"$out/t$i.sps"
    grep -o 'peak memory held by the backend: [0-9.]*' "$out/p" | awk '{print $NF}' >"$out/p$i.mem"
    grep -o 'allocated by PyTorch: [0-9.]*' "$out/t" | awk '{print $NF}' >"$out/t$i.mem"
    echo "round $r/$ROUNDS: $net batch $batch" >&2
  done
done
median() { sort -g "$1" | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
echo "| network | batch | input | pstrain samples/s | PyTorch samples/s | pstrain / PyTorch | pstrain peak MB | PyTorch peak MB |"
echo "|---|---:|---|---:|---:|---:|---:|---:|"
for i in "${!ROWS[@]}"; do
  read -r net batch shape classes layers steps <<<"${ROWS[$i]}"
  p=$(median "$out/p$i.sps")
  t=$(median "$out/t$i.sps")
  printf "| %s | %s | %s | %.0f | %.0f | %.2f | %s | %s |\n" "$net${layers/#0/}" "$batch" "$shape" \
    "$p" "$t" "$(awk -v a="$p" -v b="$t" 'BEGIN { print a / b }')" "$(cat "$out/p$i.mem")" \
    "$(cat "$out/t$i.mem")"
done
echo "($ROUNDS interleaved rounds; $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
