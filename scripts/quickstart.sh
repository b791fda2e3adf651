#!/usr/bin/env bash
# Quick start, command 1: install what is missing, build, and run the main job:
# a local cluster (1 scheduler, 1 server, 2 workers on this machine) training
# LeNet on MNIST with dist_sync, then the accuracy-per-epoch table of the job.
#
#   bash scripts/quickstart.sh                 # 3 epochs, about a minute on 2 cores
#   EPOCHS=12 bash scripts/quickstart.sh       # seed 000's length
#
# MNIST: the four idx .gz files are taken from $PSTRAIN_MNIST_DIR, else from
# ../shared/data/mnist beside the checkout, and copied to datasets/mnist.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
PSTRAIN_BUILD_TARGET=pstrain bash scripts/build.sh

MNIST=datasets/mnist
FILES=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz
       t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)
SRC=${PSTRAIN_MNIST_DIR:-../shared/data/mnist}
mkdir -p "$MNIST"
for f in "${FILES[@]}"; do
  if [[ ! -f "$MNIST/$f" ]]; then
    if [[ -f "$SRC/$f" ]]; then
      cp "$SRC/$f" "$MNIST/$f"
    else
      echo "quickstart: $f is missing: put the four MNIST idx .gz files in $MNIST" \
           "(or set PSTRAIN_MNIST_DIR to a folder holding them)" >&2
      exit 1
    fi
  fi
done

BUILD_DIR=${PSTRAIN_BUILD_DIR:-build}
PSTRAIN=$BUILD_DIR/pstrain
JOB=quickstart-$(date -u +%Y%m%d-%H%M%S)
"$PSTRAIN" launch -n 2 -s 1 --launcher local --log-dir "logs/$JOB" -- \
  "$PSTRAIN" train --network lenet --kv-store dist_sync --data-dir "$MNIST" \
  --num-epochs "${EPOCHS:-3}" --batch-size 64 --lr 0.05 --disp-batches 100

echo
echo "Accuracy per epoch (mean over the 2 workers; logs in logs/$JOB):"
"$PSTRAIN" parse-log "logs/$JOB"
