#!/usr/bin/env bash
# One training step of LeNet and MLP (batch 128, synthetic MNIST-shaped data):
# pstrain's engine (bench/nn_step_bench) and PyTorch (bench/torch_step_bench.py)
# interleaved for ROUNDS rounds, so both see the same machine load.
#   bash bench/nn_vs_torch.sh [build_dir] [rounds]
set -euo pipefail
BUILD=${1:-build}
ROUNDS=${2:-3}
cd "$(dirname "$0")/.."
echo "| network | batch | engine | threads | ms/step | cpu ms/step | samples/s |"
echo "|---|---|---|---|---|---|---|"
for round in $(seq "$ROUNDS"); do
  for net in lenet mlp; do
    steps=30; [ "$net" = mlp ] && steps=200
    for t in 0 1; do
      "$BUILD/bench/nn_step_bench" --network "$net" --steps "$steps" --threads "$t" | sed -n 3p
    done
    for t in 2 1; do
      /usr/bin/python3 bench/torch_step_bench.py --network "$net" --steps "$steps" --threads "$t"
    done
  done
done
