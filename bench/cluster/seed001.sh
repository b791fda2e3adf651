#!/usr/bin/env bash
# Seed 001's system-performance tables on emulated hosts (bench/cluster/cluster.sh):
# real kv-store traffic of the real model over shaped links, each GPU's compute
# replaced by a wait of the seed's own per-batch time (train --emulate-compute).
# Prints one markdown table per part with the seed's figure beside ours.
#
#   bench/cluster/seed001.sh [BUILD_DIR] [PARTS]    PARTS: comma list of cifar, ilsvrc, ec2
#   GC=2bit bench/cluster/seed001.sh ...            the same with 2-bit gradient compression
#   QUEUE=10ms bench/cluster/seed001.sh ...         links that queue at most 10 ms (default 50ms)
#                                                   (the rows with several machines)
#
# How each per-batch time is derived from the seed (docs/reproductions.md):
#   CIFAR-10, GTX 980: 71 s per epoch of 50,000 images at batch 256 on one GPU,
#     195.3 batches: 0.364 s per batch of 256; 0.182 s at 128 (linear in batch).
#   ILSVRC12, EC2 g2.8x: 14,203 s per epoch on one machine with 4 GPUs at batch
#     36 each (144 per step, 8,897 steps): 1.596 s per step of one GPU's 36.
#   ILSVRC12, GTX 980 (its single-machine rows are "?"): the K520's time scaled
#     by batch (48/36) and by single-precision peak (GRID K520 GPU 2.45,
#     GTX 980 4.61 TFLOP/s at base clock): 1.131 s per batch of 48.
# The ILSVRC12 parts (inception-bn, 11 M parameters, 45 MB per push) run with
# frames in the clear (PSTRAIN_WIRE_SECURITY=auth: the seed's MXNet had no
# encryption) and dilated (waits K times longer, links K times slower, times
# reported / K) so that the two cores here keep up with the hosts' CPU work:
# K=4 for the five GTX980 hosts (at K=2 the cores are saturated: the step's
# gradient hand-over alone took 0.16 s, at K=4 0.02 s; docs/reproductions.md),
# K=2 for the EC2 rows (a tenth of the traffic per step); an epoch (2,670 or 890 steps) is
# too long to run, so each row runs 2 short epochs of STEPS steps (default 40)
# and reports the second's time per step times the epoch's steps.
# A machine's GPUs run in parallel and MXNet merges them in the worker before
# pushing, so a machine is one worker with batch GPUs x batch per GPU.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=${1:-build}
STEPS=${STEPS:-40}
GC=${GC:-none} # --gc-type of every training job
QUEUE=${QUEUE:-50ms} # cluster.sh up --queue
PARTS=${2:-cifar,ilsvrc,ec2}
for part in ${PARTS//,/ }; do
  case "$part" in
    cifar | ilsvrc | ec2) ;;
    *) echo "seed001.sh: unknown part '$part' (cifar, ilsvrc, ec2)" >&2; exit 2 ;;
  esac
done
P=$(cd "$ROOT" && realpath "$BUILD/pstrain")
export PSTRAIN=$P PSTRAIN_CLUSTER_NAME=pstsd
CL="$HERE/cluster.sh"
LOGS=$(mktemp -d)
trap 'bash "$CL" down --name pstsd >/dev/null 2>&1 || true; rm -rf "$LOGS"' EXIT

# cluster HOSTS RATE: a fresh cluster of HOSTS hosts.
cluster() {
  bash "$CL" down --name pstsd >/dev/null 2>&1 || true
  bash "$CL" up "$1" --name pstsd --subnet 10.76.0 --rate "$2" --queue "$QUEUE" >/dev/null 2>&1
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
    bash "$CL" exec 1 "$P" train --image-shape "$SHAPE" --num-classes "$CLASSES" "${targs[@]}" \
      >"$LOGS/$row/worker-0.log" 2>&1 || ok=
    cp "$LOGS/$row/worker-0.log" "$LOGS/$row.out"
  else
    "${largs[@]}" --log-dir "$LOGS/$row" --timeout 3000 -- "$P" train --image-shape "$SHAPE" \
      --num-classes "$CLASSES" "${targs[@]}" --gc-type "$GC" >"$LOGS/$row.out" 2>&1 || ok=
  fi
  if [ -z "$ok" ]; then
    echo "seed001.sh: $row failed:" >&2
    tail -20 "$LOGS/$row.out" >&2
    exit 1
  fi
  epoch_time "$LOGS/$row"
}

SHAPE=3,28,28
CLASSES=10

# Seconds per step in the last epoch of the job in $1 with $2 steps per epoch.
step_time() {
  "$P" parse-log "$1" --format csv | awk -F, -v n="$2" 'NR > 1 { t = $NF } END { printf "%.3f", t / n }'
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

# An ILSVRC12 row: NAME HOSTS DILATION BATCH_PER_WORKER SECONDS KVSTORE EPOCH_STEPS on
# the cluster that is up (its links shaped DILATION times slower); prints seconds
# per step, per epoch, and the efficiency.
ilsvrc_row() {
  local name=$1 hosts=$2 dilation=$3 batch=$4 secs=$5 kv=$6 steps=$7
  local examples=$((hosts * batch * STEPS))
  local t
  SHAPE=3,224,224 CLASSES=1000 train "$name" bash "$CL" launch -n "$hosts" -s "$hosts" \
    --env PSTRAIN_WIRE_SECURITY=auth -- --network inception-bn --num-examples "$examples" \
    --num-epochs 2 --batch-size "$batch" --kv-store "$kv" --emulate-compute "$secs" --time-dilation "$dilation" >/dev/null
  t=$(step_time "$LOGS/$name" "$STEPS")
  echo "$t $(awk -v t="$t" -v n="$steps" 'BEGIN { printf "%.0f", t * n }') $(awk -v t="$t" -v s="$secs" 'BEGIN { printf "%.0f%%", 100 * s / t }')"
}

if [[ ,$PARTS, == *,ilsvrc,* ]]; then
  cluster 5 250mbit # 1 Gbit/s, dilated 4x
  echo
  echo "ILSVRC12, inception-bn, GTX980 cluster (1 Gbit/s), 1.131 s per batch of 48 per GPU, $STEPS-step epochs, dilated 4x"
  echo
  row "machines" "GPUs" "batch / GPU" "kvstore" "seed s/epoch" "pstrain s/step" "pstrain s/epoch (2,670 steps)" "efficiency"
  row "---" "---" "---" "---" "---:" "---:" "---:" "---:"
  for kv in dist_sync dist_async; do
    seed=3000
    [ "$kv" = dist_async ] && seed=2800
    read -r t e eff <<<"$(ilsvrc_row "i-$kv" 5 4 96 1.131 "$kv" 2670)"
    row 5 10 48 "$kv" "$seed" "$t" "$e" "$eff"
  done
fi

if [[ ,$PARTS, == *,ec2,* ]]; then
  echo
  echo "ILSVRC12, inception-bn, EC2 g2.8x cluster (10 Gbit/s), 1.596 s per batch of 36 per GPU, $STEPS-step epochs, dilated 2x"
  echo
  row "machines" "GPUs" "batch / GPU" "kvstore" "seed s/epoch" "pstrain s/step" "pstrain s/epoch" "efficiency"
  row "---" "---" "---" "---" "---:" "---:" "---:" "---:"
  cluster 1 5gbit
  rm -rf "$LOGS/e-local"
  mkdir -p "$LOGS/e-local"
  bash "$CL" exec 1 "$P" train --image-shape 3,224,224 --num-classes 1000 --network inception-bn \
    --num-examples $((144 * STEPS)) --num-epochs 2 --batch-size 144 --kv-store local \
    --emulate-compute 1.596 --time-dilation 2 >"$LOGS/e-local/worker-0.log" 2>&1 ||
    { echo "seed001.sh: the EC2 local row failed:" >&2; tail -20 "$LOGS/e-local/worker-0.log" >&2; exit 1; }
  t=$(step_time "$LOGS/e-local" "$STEPS")
  row 1 4 36 local 14203 "$t" "$(awk -v t="$t" 'BEGIN { printf "%.0f", t * 8897 }')" \
    "$(awk -v t="$t" 'BEGIN { printf "%.0f%%", 100 * 1.596 / t }')"
  cluster 10 5gbit # 10 Gbit/s, dilated 2x
  read -r t e eff <<<"$(ilsvrc_row e-sync 10 2 144 1.596 dist_sync 890)"
  row 10 40 36 dist_sync 1422 "$t" "$e" "$eff"
fi
