#!/usr/bin/env bash
# Training throughput on this CPU: pstrain versus PyTorch 1.13, side by side.
#
#   bash bench/train_vs_pytorch.sh [ROUNDS] [NUM_EXAMPLES]
#
# For lenet and mlp (batch 128, SGD momentum 0.9, wd 1e-4, lr 0.1, real MNIST
# from ../shared/data/mnist), runs ours and PyTorch alternately ROUNDS times
# (default 3) on NUM_EXAMPLES training examples (default 30000), both on all
# cores, and prints the best samples/sec of each and their ratio as a table.
# Ours: from `Epoch[0] Time cost` (training only); PyTorch: bench/pytorch_mnist.py.
# Both use libgomp; OMP_WAIT_POLICY (default here: passive) applies to both.
# On a loaded machine the active (spinning) policy costs both several-fold.
set -euo pipefail
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
N=${2:-30000}
DATA=${PSTRAIN_SHARED_DATA_DIR:-../shared/data}/mnist
BIN=build/pstrain
THREADS=$(nproc)
[ -x "$BIN" ] || { echo "build first: $BIN is missing" >&2; exit 1; }

ours() {  # network -> samples/sec
  local log
  log=$("$BIN" train --network "$1" --data-dir "$DATA" --num-epochs 1 --batch-size 128 \
        --num-examples "$N" --disp-batches 100000 --kv-store local 2>&1)
  local t
  t=$(grep -o 'Epoch\[0\] Time cost=[0-9.]*' <<<"$log" | sed 's/.*=//')
  [ -n "$t" ] || { echo "$log" >&2; exit 1; }
  python3 -c "import math; print('%.1f' % (math.ceil($N/128)*128/$t))"
}
theirs() {
  /usr/bin/python3 bench/pytorch_mnist.py --network "$1" --data-dir "$DATA" --batch-size 128 \
    --num-examples "$N" --threads "$THREADS" | sed 's/samples\/sec=\([0-9.]*\).*/\1/'
}

echo "OMP_WAIT_POLICY=$OMP_WAIT_POLICY threads=$THREADS examples=$N load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| network | pstrain samples/s | PyTorch samples/s | ratio | rounds |"
echo "| --- | --- | --- | --- | --- |"
for net in lenet mlp; do
  best_ours=0
  best_theirs=0
  for ((r = 0; r < ROUNDS; ++r)); do
    o=$(ours "$net")
    t=$(theirs "$net")
    best_ours=$(python3 -c "print(max($best_ours, $o))")
    best_theirs=$(python3 -c "print(max($best_theirs, $t))")
    echo "  round $r $net: pstrain $o PyTorch $t" >&2
  done
  ratio=$(python3 -c "print('%.2f' % ($best_ours / $best_theirs))")
  echo "| $net | $best_ours | $best_theirs | ${ratio}x | $ROUNDS |"
done
