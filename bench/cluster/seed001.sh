#!/usr/bin/env bash
# Seed 001's system-performance tables on emulated hosts (bench/cluster/cluster.sh):
# real kv-store traffic of the real model over shaped links, each GPU's compute
# replaced by a wait of the seed's own per-batch time (train --emulate-compute).
# Prints one markdown table per part with the seed's figure beside ours.
#
#   bench/cluster/seed001.sh [BUILD_DIR] [PARTS]    PARTS: comma list; today: cifar
#   (the ILSVRC12 rows, GTX980 and EC2 clusters, are to come: issue 14)
#
# How each per-batch time is derived from the seed (docs/reproductions.md):
#   CIFAR-10, GTX 980: 71 s per epoch of 50,000 images at batch 256 on one GPU,
#     195.3 batches: 0.364 s per batch of 256; 0.182 s at 128 (linear in batch).
# A machine's GPUs run in parallel and MXNet merges them in the worker before
# pushing, so a machine is one worker with batch GPUs x batch per GPU.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=${1:-build}
PARTS=${2:-cifar}
for part in ${PARTS//,/ }; do
  [ "$part" = cifar ] || { echo "seed001.sh: part '$part' is not there yet (cifar)" >&2; exit 2; }
done
P=$(cd "$ROOT" && realpath "$BUILD/pstrain")
export PSTRAIN=$P PSTRAIN_CLUSTER_NAME=pstsd
CL="$HERE/cluster.sh"
LOGS=$(mktemp -d)
trap 'bash "$CL" down --name pstsd >/dev/null 2>&1 || true; rm -rf "$LOGS"' EXIT

# cluster HOSTS RATE: a fresh cluster of HOSTS hosts.
cluster() {
  bash "$CL" down --name pstsd >/dev/null 2>&1 || true
  bash "$CL" up "$1" --name pstsd --subnet 10.76.0 --rate "$2" >/dev/null 2>&1
}

# Seconds per epoch (mean over epochs after the first, or the only one) of
# the job whose logs are in $1.
epoch_time() {
  "$P" parse-log "$1" --format csv | awk -F, 'NR > 1 { t[NR] = $NF; n = NR }
    END { s = 0; c = 0; for (i = (n > 2 ? 3 : 2); i <= n; ++i) { s += t[i]; ++c } printf "%.1f", s / c }'
}

# train ROW LAUNCHER_ARGS... -- TRAIN_ARGS...: runs an emulated job, prints seconds per epoch.
train() {
  local row=$1
  shift
  local largs=() targs=()
  while [ "$1" != -- ]; do largs+=("$1"); shift; done
  shift
  targs=("$@")
  rm -rf "$LOGS/$row"
  mkdir -p "$LOGS/$row"
  local ok=1
  if [ "${largs[0]}" = alone ]; then
    # One process on host 1 (kvstore local: no servers), its log as a worker's.
    bash "$CL" exec 1 "$P" train --image-shape 3,28,28 --num-classes 10 "${targs[@]}" \
      >"$LOGS/$row/worker-0.log" 2>&1 || ok=
    cp "$LOGS/$row/worker-0.log" "$LOGS/$row.out"
  else
    "${largs[@]}" --log-dir "$LOGS/$row" --timeout 3000 -- "$P" train --image-shape 3,28,28 \
      --num-classes 10 "${targs[@]}" >"$LOGS/$row.out" 2>&1 || ok=
  fi
  if [ -z "$ok" ]; then
    echo "seed001.sh: $row failed:" >&2
    tail -20 "$LOGS/$row.out" >&2
    exit 1
  fi
  epoch_time "$LOGS/$row"
}

row() { printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$@"; }

if [[ ,$PARTS, == *,cifar,* ]]; then
  cluster 5 1gbit
  echo
  echo "CIFAR-10, inception-bn-28-small, GTX980 cluster (1 Gbit/s), 3 epochs of 50,000 images"
  echo
  row "machines" "GPUs" "batch / GPU" "kvstore" "seed s/epoch" "pstrain s/epoch" "ideal (compute only)" "efficiency"
  row "---" "---" "---" "---" "---:" "---:" "---:" "---:"
  net=(--network inception-bn-28-small --num-examples 50000 --num-epochs 3)
  t=$(train c1 alone -- "${net[@]}" --num-epochs 1 --batch-size 256 --kv-store local \
    --emulate-compute 0.364)
  row 1 1 256 local 71 "$t" "$(awk 'BEGIN { printf "%.1f", 196 * 0.364 }')" \
    "$(awk -v t="$t" 'BEGIN { printf "%.0f%%", 100 * 196 * 0.364 / t }')"
  t=$(train c2 bash "$CL" exec 1 "$P" launch --launcher local -n 1 -s 1 -- "${net[@]}" --num-epochs 1 \
    --batch-size 128 --kv-store dist_sync --emulate-compute 0.182)
  row 1 1 128 dist_sync 128 "$t" "$(awk 'BEGIN { printf "%.1f", 391 * 0.182 }')" \
    "$(awk -v t="$t" 'BEGIN { printf "%.0f%%", 100 * 391 * 0.182 / t }')"
  t=$(train c3 bash "$CL" launch -n 5 -s 5 -- "${net[@]}" --batch-size 512 --kv-store dist_sync \
    --emulate-compute 0.364)
  row 5 10 256 dist_sync 7 "$t" "$(awk 'BEGIN { printf "%.1f", 20 * 0.364 }')" \
    "$(awk -v t="$t" 'BEGIN { printf "%.0f%%", 100 * 20 * 0.364 / t }')"
  t=$(train c4 bash "$CL" launch -n 5 -s 5 -- "${net[@]}" --batch-size 256 --kv-store dist_sync \
    --emulate-compute 0.182)
  row 5 10 128 dist_sync 11 "$t" "$(awk 'BEGIN { printf "%.1f", 40 * 0.182 }')" \
    "$(awk -v t="$t" 'BEGIN { printf "%.0f%%", 100 * 40 * 0.182 / t }')"
fi
