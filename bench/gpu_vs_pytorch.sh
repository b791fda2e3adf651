#!/usr/bin/env bash
# One training step on GPU 0, pstrain (bench/nn_step_bench --gpus 0) beside
# PyTorch eager with cuDNN benchmark mode (bench/torch_step_bench.py, the
# same networks in bench/torch_models.py), interleaved round by round:
# samples/s (median of the rounds) and peak device memory. The rows are the
# seeds' single-GPU figures (issue 10): LeNet (seed 000), inception-bn-28-small
# on 28x28 CIFAR (seed 001), ResNet-50 and Inception-v3 (seed 003), the neon
# CIFAR-10 conv net (seed 004).
#   bash bench/gpu_vs_pytorch.sh [build_dir] [rounds]     # PYTHON=python3 by default
# Environment:
#   NN_STEP_BENCH  path/to/nn_step_bench where it is not build_dir/bench/ (a bundle, say)
#   BUDGET_S       no round starts that the last round's time says would end
#                  after BUDGET_S seconds from the start (default: no limit)
#   LOG_DIR        keep every run's output there (default: a temporary folder)
#   ROWS_MATCHING  only the rows whose network matches this regex
#   BENCH_DEVICE   cuda (default), or cpu to try the script on a host without a GPU
# The table is printed after every round, so a run cut short keeps what it
# measured; a row that fails says so in the table and leaves its output in
# LOG_DIR, and the other rows go on (the exit status is then 1).
set -uo pipefail
BUILD=${1:-build}
ROUNDS=${2:-3}
PY=${PYTHON:-python3}
BUDGET=${BUDGET_S:-0}
DEVICE=${BENCH_DEVICE:-cuda}
cd "$(dirname "$0")/.." || exit 1
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
if [[ -n ${ROWS_MATCHING:-} ]]; then
  for i in "${!ROWS[@]}"; do [[ ${ROWS[$i]%% *} =~ $ROWS_MATCHING ]] || unset "ROWS[$i]"; done
  ROWS=("${ROWS[@]}")
fi
case $DEVICE in
  cuda) on_device=(--gpus 0) ;;
  cpu) on_device=() ;;
  *) echo "gpu_vs_pytorch: BENCH_DEVICE is cuda or cpu, not '$DEVICE'" >&2; exit 2 ;;
esac
out=${LOG_DIR:-}
if [[ -z $out ]]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out" || exit 1

median() {
  sort -g "$1" | awk '{ a[NR] = $1 } END { if (NR == 0) print "failed"; else print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
# table ROUNDS_DONE: the table of the rounds so far.
table() {
  echo "| network | batch | input | pstrain samples/s | PyTorch samples/s | pstrain / PyTorch | pstrain peak MB | PyTorch peak MB |"
  echo "|---|---:|---|---:|---:|---:|---:|---:|"
  local i net batch shape classes layers steps p t
  for i in "${!ROWS[@]}"; do
    read -r net batch shape classes layers steps <<<"${ROWS[$i]}"
    p=$(median "$out/p$i.sps")
    t=$(median "$out/t$i.sps")
    printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n" "$net${layers/#0/}" "$batch" "$shape" \
      "$(awk -v a="$p" 'BEGIN { print (a == "failed") ? a : sprintf("%.0f", a) }')" \
      "$(awk -v a="$t" 'BEGIN { print (a == "failed") ? a : sprintf("%.0f", a) }')" \
      "$(awk -v a="$p" -v b="$t" 'BEGIN { print (a + 0 > 0 && b + 0 > 0) ? sprintf("%.2f", a / b) : "-" }')" \
      "$(cat "$out/p$i.mem" 2>/dev/null)" "$(cat "$out/t$i.mem" 2>/dev/null)"
  done
  echo "($1 of $ROUNDS interleaved rounds; $DEVICE; $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
}

# measure WHO ROW LINE MEMORY COMMAND...: runs COMMAND (a bench printing
# nn_step_bench's table) into its log in $out; appends the samples/s of its
# table line LINE (an awk pattern) to ROW.sps and puts the figure after
# "MEMORY: " into ROW.mem, or counts a failure and shows the log's tail.
# (Reads r, net and batch.)
measure() {
  local who=$1 row=$2 line=$3 memory=$4 log
  shift 4
  log=$out/$who-$net-$batch-round$r.txt
  if "$@" >"$log" 2>&1; then
    awk -F'|' "$line"' { gsub(/ /, "", $8); print $8 }' "$log" >>"$out/$row.sps"
    grep -o "$memory: [0-9.]*" "$log" | awk '{print $NF}' >"$out/$row.mem"
  else
    ((failures++))
    echo "round $r: $who failed on $net batch $batch:" >&2
    tail -n 5 "$log" >&2
  fi
}

start=$SECONDS
failures=0
for i in "${!ROWS[@]}"; do : >"$out/p$i.sps"; : >"$out/t$i.sps"; done
for ((r = 1; r <= ROUNDS; r++)); do
  round_start=$SECONDS
  for i in "${!ROWS[@]}"; do
    read -r net batch shape classes layers steps <<<"${ROWS[$i]}"
    common=(--network "$net" --batch "$batch" --image-shape "$shape" --num-classes "$classes"
            --num-layers "$layers" --steps "$steps")
    measure pstrain "p$i" 'NR == 3' 'peak memory held by the backend' \
      "${NN_STEP_BENCH:-$BUILD/bench/nn_step_bench}" "${common[@]}" "${on_device[@]}"
    measure PyTorch "t$i" '/^\| /' 'allocated by PyTorch' \
      "$PY" bench/torch_step_bench.py "${common[@]}" --device "$DEVICE"
    echo "round $r/$ROUNDS: $net batch $batch" >&2
  done
  table "$r"
  echo
  took=$((SECONDS - round_start))
  if ((BUDGET > 0 && r < ROUNDS && SECONDS - start + took > BUDGET)); then
    echo "(stopped after round $r: a round takes ${took} s, and another would end past BUDGET_S=$BUDGET)"
    break
  fi
done
if ((failures > 0)); then
  echo "gpu_vs_pytorch: $failures run(s) failed${LOG_DIR:+; their output is in $LOG_DIR}" >&2
  exit 1
fi
