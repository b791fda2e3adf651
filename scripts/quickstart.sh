#!/usr/bin/env bash
# Quick start, command 1: install what is missing, build, and run the main job:
# a local cluster (1 scheduler, 1 server, 2 workers on this machine) training
# LeNet on MNIST with dist_sync, then the accuracy-per-epoch table of the job.
#
#   bash scripts/quickstart.sh                 # 3 epochs, about a minute on 2 cores
#   EPOCHS=12 bash scripts/quickstart.sh       # seed 000's length
#   NUM_EXAMPLES=6400 bash scripts/quickstart.sh   # a shorter epoch, for a quick look
#
# MNIST comes from the first folder that holds it: $PSTRAIN_MNIST_DIR,
# $PSTRAIN_DATA/mnist, datasets/mnist, ../shared/data/mnist; when none does it
# is fetched into $PSTRAIN_DATA/mnist or datasets/mnist from its public
# mirrors (`pstrain data locate mnist`; PSTRAIN_DATA_MIRRORS names others).
# PSTRAIN_QUICKSTART_SETUP=0 skips installing and building (the binary is
# $PSTRAIN_BUILD_DIR/pstrain, default build/pstrain).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${PSTRAIN_QUICKSTART_SETUP:-1}" != "0" ]]; then
  bash scripts/install-deps.sh
  PSTRAIN_BUILD_TARGET=pstrain bash scripts/build.sh
fi

BUILD_DIR=${PSTRAIN_BUILD_DIR:-build}
PSTRAIN=$BUILD_DIR/pstrain
# Prints the folder (progress and errors go to stderr); offline, it says
# which files to put where.
MNIST=$("$PSTRAIN" data locate mnist)
echo "quickstart: MNIST in $MNIST"

EXTRA=()
if [[ -n "${NUM_EXAMPLES:-}" ]]; then EXTRA+=(--num-examples "$NUM_EXAMPLES"); fi
JOB=quickstart-$(date -u +%Y%m%d-%H%M%S)
"$PSTRAIN" launch -n 2 -s 1 --launcher local --log-dir "logs/$JOB" -- \
  "$PSTRAIN" train --network lenet --kv-store dist_sync --data-dir "$MNIST" \
  --num-epochs "${EPOCHS:-3}" --batch-size 64 --lr 0.05 --disp-batches 100 "${EXTRA[@]}"

echo
echo "Accuracy per epoch (mean over the 2 workers; logs in logs/$JOB):"
"$PSTRAIN" parse-log "logs/$JOB"
