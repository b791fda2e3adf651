#!/usr/bin/env bash
# Seed 001's CIFAR-10 accuracy runs on one GPU (GPU 0), inception-bn-28-small
# with the 2015 scripts' hyperparameters (wd 0.00001, Uniform(0.07), epochs of
# 60,000 images), from the CIFAR-10 JPEG set packed by `pstrain im2rec`:
#   incept_3   1 GPU, batch 128, lr 0.1, --kv-store local
#   incept_3_fixed  the same, reading train.rec in its file order every epoch
#              (--shuffle-train 0), as the 2015 ImageRecordIter did
#   torch_3    incept_3 in PyTorch on the same files (bench/torch_cifar_rec.py,
#              $PYTHON or python3, CUDA unless TORCH_DEVICE says otherwise),
#              also scoring the exact test images of DATA/cifar10_partial
#              and their JPEG twins where that folder is there
#   incept_5   10 GPU workers (all on GPU 0), 5 servers, dist_sync, 256 per GPU, lr 0.1
#   incept_6   the same, lr 0.4
#   incept_7   10 workers, 128 per GPU, lr 0.1
#   incept_4   10 workers, 128 per GPU, lr 0.4
#   async      10 workers, 256 per GPU, lr 0.1, dist_async
# (the seed's 5 machines had 2 GPUs each and a batch of 512 or 256 per machine).
# Prints a `pstrain parse-log` table per run (10-worker runs: worker 0's log and
# the mean validation accuracy of the ten workers, each scoring its tenth of
# the test set). Runs stop after EPOCHS epochs or SECONDS seconds, whichever
# comes first. EXAMPLES: images per epoch (60,000 unless set; a smaller
# figure makes a quick try of the script). PARALLEL=1 starts every run named
# at once on the one GPU (two single-GPU runs fit one 10-minute call so; ten
# workers' runs are better one at a time) and prints their tables in order.
# LOG_DIR: keep every run's logs there (default: with the data, removed at the end).
#   bash bench/gpu_seed001.sh [pstrain] [runs] [epochs] [seconds]
#   e.g. bash bench/gpu_seed001.sh build/pstrain "incept_3 incept_5" 40 600
set -uo pipefail
P=$(realpath -e "${1:-build/pstrain}") || exit 1  # absolute: the packing runs elsewhere
RUNS=${2:-incept_3 incept_5 incept_6 incept_7 incept_4 async}
EPOCHS=${3:-40}
LIMIT=${4:-3600}
EXAMPLES=${EXAMPLES:-60000}
PARALLEL=${PARALLEL:-0}
DATA=${PSTRAIN_SHARED_DATA_DIR:-../shared/data}
cd "$(dirname "$0")/.." || exit 1
# settings RUN: sets one (1: one GPU, 0: ten workers, torch), batch, lr, kv
# and order (0: the file's order) for RUN; fails for a run it does not know.
settings() {
  local run=$1
  order=1
  case $run in
    incept_3) one=1 batch=128 lr=0.1 kv=local ;;
    incept_3_fixed) one=1 batch=128 lr=0.1 kv=local order=0 ;;
    torch_3) one=torch batch=128 lr=0.1 kv=local ;;
    incept_5) one=0 batch=256 lr=0.1 kv=dist_sync ;;
    incept_6) one=0 batch=256 lr=0.4 kv=dist_sync ;;
    incept_7) one=0 batch=128 lr=0.1 kv=dist_sync ;;
    incept_4) one=0 batch=128 lr=0.4 kv=dist_sync ;;
    async) one=0 batch=256 lr=0.1 kv=dist_async ;;
    *) echo "gpu_seed001: unknown run $run" >&2; return 2 ;;
  esac
}
for run in $RUNS; do settings "$run" || exit 2; done
# The preparation (unpacking, packing, the mean image) takes up to about
# three minutes: with less than that and a run's minute left, none starts.
if [[ -n ${DEADLINE_S:-} ]] && ((DEADLINE_S - SECONDS < 240)); then
  echo "gpu_seed001: $((DEADLINE_S - SECONDS)) s left of DEADLINE_S do not fit the" \
    "preparation and a run (240 s at least)" >&2
  exit 2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
keep=${LOG_DIR:-$work}
mkdir -p "$keep" || exit 1

tar -xzf "$DATA/cifar10_jpeg/cifar10-jpeg.tar.gz" -C "$work" || exit 1
(cd "$work" && "$P" im2rec --list --recursive cifar_train train >/dev/null &&
  "$P" im2rec --list --recursive cifar_test test >/dev/null &&
  "$P" im2rec --num-thread "$(nproc)" cifar_train train >/dev/null &&
  "$P" im2rec --num-thread "$(nproc)" cifar_test test >/dev/null) || exit 1
# shellcheck disable=SC2054  # the commas are in values (3,28,28)
common=(--network inception-bn-28-small --data-train "$work/cifar_train.rec"
  --data-val "$work/cifar_test.rec" --image-shape 3,28,28 --num-classes 10 --random-crop 1
  --random-mirror 1 --mean-img "$work/mean.bin" --wd 0.00001 --initializer "uniform(0.07)"
  --num-examples "$EXAMPLES" --num-epochs "$EPOCHS" --gpus 0)
# The mean image once, before any run reads it (10 workers would race to write it).
timeout -k 10 120 "$P" train "${common[@]}" --num-epochs 1 --num-examples 128 --batch-size 128 \
  --kv-store local >"$keep/mean.log" 2>&1
[[ -s $work/mean.bin ]] || {
  echo "gpu_seed001: the mean image was not made; $keep/mean.log ends:" >&2
  tail -n 5 "$keep/mean.log" >&2
  exit 1
}

# torch_3 also scores the exact test images we have (DATA/cifar10_partial: the
# first 1,017) and their JPEG twins, each epoch: what the JPEG copy costs a
# model trained on the full JPEG set at test time (bench/cifar_twins.py).
twins=()
if [[ " $RUNS " == *" torch_3 "* && -s $DATA/cifar10_partial/classes.txt ]]; then
  if "$P" rec cifar10 "$DATA/cifar10_partial" "$work/exact" >/dev/null &&
    "${PYTHON:-python3}" bench/cifar_twins.py "$DATA/cifar10_partial" "$work" test >/dev/null &&
    "$P" im2rec --num-thread "$(nproc)" "$work/jpeg_test" "$work" >/dev/null; then
    twins=("exact=$work/exact/test.rec" "twins=$work/jpeg_test.rec")
  else
    echo "gpu_seed001: the exact test images and their twins could not be packed" >&2
  fi
fi

# ended LOG STATUS: a line saying how a run that did not end by itself ended:
# at the time limit (timeout's 124), or failing (then LOG's last lines).
ended() {
  case $2 in
    0) ;;
    124) echo "(stopped at the time limit, ${LIMIT} s)" ;;
    *) echo "(failed, exit $2; the log's last lines:)"; tail -n 5 "$1" ;;
  esac
}

# run_one RUN: one run's heading and parse-log table on stdout (its logs in $keep).
run_one() {
  local run=$1 order one batch lr kv logs
  settings "$run" || return 2
  echo "### $run: batch $batch per GPU, lr $lr, $kv$([[ $one == 0 ]] && echo ', 10 workers, 5 servers')$([[ $order == 0 ]] && echo ', file order')$([[ $one == torch ]] && echo ', PyTorch')"
  echo
  if [[ $one == torch ]]; then
    timeout -k 10 "$LIMIT" "${PYTHON:-python3}" bench/torch_cifar_rec.py "$work/cifar_train.rec" \
      "$work/cifar_test.rec" "$EPOCHS" "$(nproc)" "${TORCH_DEVICE:-cuda}" "$EXAMPLES" \
      "${twins[@]}" >"$keep/$run.log" 2>&1
    ended "$keep/$run.log" $?
    "$P" parse-log "$keep/$run.log" --val-prefix valid \
      --metric-names "accuracy$( ((${#twins[@]})) && echo ,exact-accuracy,twins-accuracy)"
  elif [[ $one == 1 ]]; then
    timeout -k 10 "$LIMIT" "$P" train "${common[@]}" --batch-size "$batch" --lr "$lr" \
      --kv-store "$kv" --shuffle-train "$order" --disp-batches 100 >"$keep/$run.log" 2>&1
    ended "$keep/$run.log" $?
    "$P" parse-log "$keep/$run.log"
  else
    logs=$keep/logs-$run
    rm -rf "$logs"
    timeout -k 10 "$LIMIT" "$P" launch -n 10 -s 5 --launcher local --quiet --log-dir "$logs" -- \
      "$P" train "${common[@]}" --batch-size "$batch" --lr "$lr" --kv-store "$kv" \
      --data-nthreads 1 --disp-batches 10 >"$keep/$run.log" 2>&1
    ended "$keep/$run.log" $?
    "$P" parse-log "$logs/worker-0.log"
    echo
    echo "mean validation accuracy of the ten workers, every fifth epoch:"
    cat "$logs"/worker-*.log | grep -o "Epoch\[[0-9]*\] Validation-accuracy=[0-9.]*" |
      sed 's/Epoch\[\([0-9]*\)\] Validation-accuracy=/\1 /' |
      awk '{ s[$1] += $2; n[$1]++ } END { for (e in s) if ((e + 1) % 5 == 0) printf "%d %.4f\n", e + 1, s[e] / n[e] }' |
      sort -n | tr '\n' ';'
    echo
  fi
  echo
}

# Every run ends by DEADLINE_S (seconds of this script, the preparation
# included), rather than be killed with its logs unpacked: with PARALLEL=1
# each run's limit is what is left; one after another, each run's limit is
# its share of what is left when it starts (a run ended early leaves more to
# the next). 20 s a run are kept for a 10-worker job's stopping and parse-log.
# fit_limit N: LIMIT cut to N runs' share of what is left; fails under 60 s.
ASKED=$LIMIT
fit_limit() {
  local share=$(((${DEADLINE_S:-100000} - SECONDS) / $1 - 20))
  LIMIT=$ASKED
  if ((share < LIMIT)); then
    LIMIT=$share
    echo "gpu_seed001: the next run limited to $LIMIT s to end by DEADLINE_S" >&2
  fi
  if ((LIMIT < 60)); then
    echo "gpu_seed001: $1 run(s) do not fit what is left of DEADLINE_S" >&2
    return 1
  fi
}
failed=0
if [[ $PARALLEL == 1 ]]; then
  # Every run at once, sharing the GPU (each slower, all inside one call);
  # the tables then in the order asked.
  fit_limit 1 || exit 2
  for run in $RUNS; do run_one "$run" >"$keep/$run.table" 2>&1 & done
  wait
  for run in $RUNS; do cat "$keep/$run.table"; done
  grep -q '^(failed, exit' "$keep"/*.table && failed=1
else
  n=$(wc -w <<<"$RUNS")
  for run in $RUNS; do
    fit_limit "$n" || exit 2
    run_one "$run" | tee "$keep/$run.table"
    grep -q '^(failed, exit' "$keep/$run.table" && failed=1
    n=$((n - 1))
  done
fi
# (a run stopped at its time limit has its table: it is no failure)
exit $failed
