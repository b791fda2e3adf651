#!/usr/bin/env bash
# Each optimizer training LeNet on real MNIST in one process (--kv-store
# local, batch 128, fit.py's other defaults: wd 1e-4, Xavier): validation
# accuracy per epoch and seconds per epoch, one run after the other on the
# same machine. The rates are the usual ones for each rule (fit.py's --lr 0.1
# is SGD's; the adaptive rules want about 0.001; nag stays at chance at 0.1,
# as PyTorch's nesterov SGD does: bench/RESULTS.md, "Optimizers").
#   bash bench/optimizers_mnist.sh [build_dir] [epochs] [data_dir]
# Logs go to $LOGS (default: a temporary folder, removed at the end).
set -euo pipefail
BUILD=${1:-build}
EPOCHS=${2:-3}
DATA=${3:-../shared/data/mnist}
cd "$(dirname "$0")/.."
LOGS=${LOGS:-}
if [[ -z $LOGS ]]; then
  LOGS=$(mktemp -d)
  trap 'rm -rf "$LOGS"' EXIT
fi
mkdir -p "$LOGS"

# name|flags
RUNS=(
  "sgd|--optimizer sgd --lr 0.1 --mom 0.9"
  "nag|--optimizer nag --lr 0.05 --mom 0.9"
  "adam|--optimizer adam --lr 0.001"
  "rmsprop|--optimizer rmsprop --lr 0.001"
  "adagrad|--optimizer adagrad --lr 0.01"
)
for run in "${RUNS[@]}"; do
  name=${run%%|*}
  flags=${run#*|}
  # shellcheck disable=SC2086  # the flags are words
  "$BUILD/pstrain" train --network lenet --data-dir "$DATA" --kv-store local \
    --num-epochs "$EPOCHS" --seed 1 $flags >"$LOGS/$name.log" 2>&1
done

printf '| optimizer | flags |'
for e in $(seq "$EPOCHS"); do printf ' epoch %d |' "$e"; done
printf ' s/epoch |\n|---|---|'
for _ in $(seq "$EPOCHS"); do printf -- '---|'; done
printf -- '---|\n'
for run in "${RUNS[@]}"; do
  name=${run%%|*}
  flags=${run#*|}
  accs=$(grep -o 'Validation-accuracy=[0-9.]*' "$LOGS/$name.log" | cut -d= -f2 | tr '\n' ' ')
  secs=$(grep -o 'Time cost=[0-9.]*' "$LOGS/$name.log" | cut -d= -f2 |
    awk '{s += $1; n++} END {if (n) printf "%.1f", s / n}')
  printf '| %s | `%s` |' "$name" "$flags"
  for a in $accs; do printf ' %.4f |' "$a"; done
  printf ' %s |\n' "$secs"
done
