#!/usr/bin/env bash
# Issue 11's figures on one physical GPU (GPU 0), side by side in one run:
#  1. the merge's cost: `pstrain train --benchmark 1` with GPU 0 listed 1, 2
#     and 4 times (--kv-store local: the sum on the CPU; device: on the first
#     listing), against PyTorch's DistributedDataParallel with as many
#     processes on the same GPU, each on its share of the batch
#     (bench/torch_ddp_split_step.py, gloo);
#  2. the communication a GPU worker hides in dist_sync: local training, the
#     same worker under `pstrain launch -n 1 -s S` (S = 1, 2), and the
#     exchange alone (--emulate-compute 0.0001: no compute, the same pushes
#     and pulls). Hidden = (local step + exchange step - dist step) / exchange step.
# samples/s are the median Speedometer figure of one run (the first two
# dropped). Prints two markdown tables.
#   bash bench/gpu_merge_bench.sh [pstrain] [networks]   # default: build/pstrain "lenet resnet"
#   PYTHON=python3 by default (it needs torch with CUDA; TORCH_DEVICE=cpu runs
#   its DDP on the CPU, to try the script on a host without a GPU)
#   LOG_DIR: keep every run's log there (default: a temporary folder)
#   RUN_TIMEOUT_S: the most one run may take (default 150 s; a run is seconds)
# A run that fails shows as "failed" in its table, with its log's last lines
# on stderr.
set -uo pipefail
P=${1:-build/pstrain}
NETS=${2:-lenet resnet}
PY=${PYTHON:-python3}
LIMIT=${RUN_TIMEOUT_S:-150}
cd "$(dirname "$0")/.." || exit 1
work=${LOG_DIR:-}
if [[ -z $work ]]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work" || exit 1

args() {
  case $1 in
    lenet) echo "--network lenet --image-shape 1,28,28 --num-classes 10 --batch-size 512 --num-examples 102400" ;;
    resnet) echo "--network resnet --num-layers 50 --image-shape 3,224,224 --num-classes 1000 --batch-size 128 --num-examples 3840" ;;
    *) echo "gpu_merge_bench: no settings for network $1" >&2; exit 2 ;;
  esac
}
torch_args() {
  case $1 in
    lenet) echo "--network lenet --image-shape 1,28,28 --num-classes 10 --batch 512 --steps 100" ;;
    resnet) echo "--network resnet --num-layers 50 --image-shape 3,224,224 --num-classes 1000 --batch 128 --steps 20" ;;
  esac
}
batch_of() {  # the --batch-size in a list of arguments
  while [[ $# -gt 0 && $1 != --batch-size ]]; do shift; done
  echo "${2:-?}"
}
# speed LOG STATUS: the median Speedometer figure of LOG, or "failed" (and
# LOG's last lines on stderr) when the run's STATUS is not 0 or LOG has none.
speed() {
  local s
  s=$(grep -o "Speed: [0-9.]*" "$1" 2>/dev/null | awk 'NR > 2 { print $2 }' | sort -g |
    awk '{ a[NR] = $1 } END { if (NR) printf "%.0f", a[int((NR + 1) / 2)] }')
  if [[ $2 != 0 || -z $s ]]; then
    echo "gpu_merge_bench: $1: exit $2, no speed; its last lines:" >&2
    tail -n 5 "$1" >&2
    s=failed
  fi
  printf "%s" "$s"
}
train() {  # name, then the train arguments
  local log=$work/$1.log
  shift
  timeout "$LIMIT" "$P" train "$@" --benchmark 1 --num-epochs 1 --disp-batches 5 >"$log" 2>&1
  speed "$log" $?
}
launch() {  # name, servers, then the train arguments
  local logs=$work/$1 servers=$2 status
  shift 2
  rm -rf "$logs"
  timeout "$LIMIT" "$P" launch -n 1 -s "$servers" --launcher local --quiet --log-dir "$logs" -- \
    "$P" train "$@" --benchmark 1 --num-epochs 1 --disp-batches 5 >"$logs.log" 2>&1
  status=$?
  if [[ ! -s $logs/worker-0.log ]]; then
    speed "$logs.log" "$status"
  else
    speed "$logs/worker-0.log" "$status"
  fi
}

echo "| network, batch | GPU 0 listed | pstrain local | pstrain device | PyTorch DDP (gloo), processes on GPU 0 |"
echo "|---|---:|---:|---:|---:|"
for net in $NETS; do
  read -r -a a <<<"$(args "$net")"
  for n in 1 2 4; do
    gpus=$(printf '0%.0s,' $(seq "$n"))
    gpus=${gpus%,}
    loc=$(train "$net-x$n-local" "${a[@]}" --gpus "$gpus" --kv-store local)
    dev=-
    [[ $n -gt 1 ]] && dev=$(train "$net-x$n-device" "${a[@]}" --gpus "$gpus" --kv-store device)
    read -r -a t <<<"$(torch_args "$net")"
    timeout "$LIMIT" "$PY" bench/torch_ddp_split_step.py "${t[@]}" --processes "$n" \
      --device "${TORCH_DEVICE:-cuda}" >"$work/$net-x$n-ddp.log" 2>&1
    ddp=$(sed -n 's/.*samples_per_s=\([0-9.]*\).*/\1/p' "$work/$net-x$n-ddp.log")
    [[ -n $ddp ]] || tail -n 5 "$work/$net-x$n-ddp.log" >&2
    echo "| $net, $(batch_of "${a[@]}") | $n | $loc | $dev | ${ddp:-failed} |"
  done
done
echo
echo "| network, batch | local | dist_sync 1 server | exchange alone, 1 server | hidden | dist_sync 2 servers | exchange alone, 2 servers | hidden |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
hidden() {  # samples/s of local, dist, exchange alone -> share hidden
  awk -v l="$1" -v d="$2" -v c="$3" 'BEGIN {
    if (l + 0 == 0 || d + 0 == 0 || c + 0 == 0) { print "-"; exit }
    ls = 1 / l; ds = 1 / d; cs = 1 / c; h = (ls + cs - ds) / cs
    if (h < 0) h = 0; if (h > 1) h = 1; printf "%.0f%%", 100 * h }'
}
for net in $NETS; do
  read -r -a a <<<"$(args "$net")"
  loc=$(train "$net-x1-local-again" "${a[@]}" --gpus 0 --kv-store local)
  row="| $net, $(batch_of "${a[@]}") | $loc"
  for s in 1 2; do
    d=$(launch "$net-dist-sync-$s-servers" "$s" "${a[@]}" --gpus 0 --kv-store dist_sync)
    c=$(launch "$net-exchange-$s-servers" "$s" "${a[@]}" --kv-store dist_sync --emulate-compute 0.0001)
    row+=" | $d | $c | $(hidden "$loc" "$d" "$c")"
  done
  echo "$row |"
done
echo "($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1); $(date -u '+%Y-%m-%d %H:%M UTC'))"
