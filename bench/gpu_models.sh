#!/usr/bin/env bash
# `pstrain train` on every model of the zoo (issue 10's "--gpus 0 trains every
# model"): synthetic data of each model's input shape (--benchmark 1), EPOCHS
# epochs of BATCHES batches each; prints a row per model with the last epoch's
# samples/s (its examples over its "Time cost") and the peak device memory
# the trainer logs, or why the run failed.
#   bash bench/gpu_models.sh [pstrain] [gpus] [epochs] [batches] [models]
#   e.g. bash bench/gpu_models.sh build/pstrain 0 2 20      (GPU 0)
#        bash bench/gpu_models.sh build/pstrain "" 1 2 "mlp lenet"   (CPU: a quick try)
# LOG_DIR: keep each run's log there (default: a temporary folder);
# MODEL_LIMIT_S: the most one model's run may take (150 s); DEADLINE_S: the
# seconds of this script by which every run has ended (none unless set): a
# model not started for want of time gets a row saying so.
set -uo pipefail
P=${1:-build/pstrain}
GPUS=${2-0}
EPOCHS=${3:-2}
BATCHES=${4:-20}
MODELS=${5:-mlp lenet keras-mnist-cnn neon-cifar10-conv inception-bn-28-small inception-bn resnet inception-v3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
keep=${LOG_DIR:-$work}
mkdir -p "$keep" || exit 1

# shape MODEL: sets the input shape, classes, batch and extra flags of MODEL
# as the seeds run it; fails for a model it does not know.
shape() {
  extra=()
  case $1 in
    mlp | lenet | keras-mnist-cnn) image=1,28,28 classes=10 batch=128 ;;
    neon-cifar10-conv) image=3,32,32 classes=10 batch=128 ;;
    inception-bn-28-small) image=3,28,28 classes=10 batch=128 ;;
    inception-bn) image=3,224,224 classes=1000 batch=32 ;;
    resnet) image=3,224,224 classes=1000 batch=32 extra=(--num-layers 50) ;;
    inception-v3) image=3,299,299 classes=1000 batch=32 ;;
    *) echo "gpu_models: unknown model $1" >&2; return 2 ;;
  esac
}

echo "| model | input | batch | samples/s (last epoch) | peak device memory | result |"
echo "|---|---|---:|---:|---|---|"
rc=0
for m in $MODELS; do
  shape "$m" || exit 2
  log=$keep/$m.log
  devices=()
  [[ -n $GPUS ]] && devices=(--gpus "$GPUS")
  # (a model that hangs may not take the device call's 10 minutes with it)
  limit=${MODEL_LIMIT_S:-150}
  if [[ -n ${DEADLINE_S:-} ]] && ((DEADLINE_S - SECONDS < limit)); then
    limit=$((DEADLINE_S - SECONDS))
  fi
  if ((limit < 20)); then
    echo "| $m | $image | $batch | - | - | not run: the time is up ($limit s left of DEADLINE_S) |"
    rc=1
    continue
  fi
  timeout -k 10 "$limit" "$P" train --network "$m" ${extra[@]+"${extra[@]}"} \
    --benchmark 1 --image-shape "$image" --num-classes "$classes" --batch-size "$batch" \
    --num-examples $((batch * BATCHES)) --num-epochs "$EPOCHS" --disp-batches "$BATCHES" \
    --kv-store local ${devices[@]+"${devices[@]}"} >"$log" 2>&1
  status=$?
  last=$((EPOCHS - 1))
  # The last epoch's samples over its "Time cost" (the first pays the set-up).
  cost=$(grep -oE "Epoch\[$last\] Time cost=[0-9.]+" "$log" | grep -oE '[0-9.]+$')
  speed=
  [[ -n $cost ]] && speed=$(awk -v n=$((batch * BATCHES)) -v t="$cost" 'BEGIN { printf "%.0f", n / t }')
  # "Epoch[N] gpu(0) memory: peak 40 MiB, ...": every listed GPU's, joined.
  memory=$(grep -oE "Epoch\[$last\] [a-z]+\([0-9]+\)[^:]* memory: peak [0-9]+ MiB" "$log" |
    sed -E 's/^Epoch\[[0-9]+\] //; s/ memory: peak / /' | paste -sd ';' -)
  if ((status == 0)); then
    result=ok
  elif ((status == 124)); then
    result="stopped at its time limit ($limit s)"
    rc=1
  else
    result="failed (exit $status): $(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-160)"
    rc=1
  fi
  echo "| $m | $image | $batch | ${speed:--} | ${memory:--} | $result |"
done
exit $rc
