#!/usr/bin/env bash
# Prepares a GPU session's device calls here, on the development machine, so
# that device time goes to runs only: bundles the build (scripts/bundle.sh,
# with the gpu test binaries and nn_step_bench) into .gpu/bundle.tar.gz, lays
# the data the phases need in .gpu/data, checks that what travels fits the
# device tool's 64 MiB, and prints the call to make.
#   bash bench/gpu_prepare.sh [build_dir] [mnist|cifar|none] [phases]
#   e.g. bash bench/gpu_prepare.sh build mnist tests,models   (the default)
#        bash bench/gpu_prepare.sh build cifar seed001
# mnist: MNIST (the tests phase); cifar: the CIFAR-10 JPEG set and, for
# torch_3's exact test images, cifar10_partial's test batch, classes and one
# training batch (the seed001 phase); the bundle and one of them fit, not
# both. DATA: where they are read from (../shared/data by default).
# .gpu/ is ignored by git: the call must name it in `carry`.
set -euo pipefail
build=${1:-build}
data=${2:-mnist}
phases=${3:-tests,models}
cd "$(dirname "$0")/.."
src=${DATA:-../shared/data}
limit=$((64 * 1024 * 1024))
git check-ignore -q .gpu/x || { echo "gpu_prepare: .gpu/ is not ignored by git" >&2; exit 1; }
rm -rf .gpu/data
mkdir -p .gpu/data
bash scripts/bundle.sh .gpu/bundle.tar.gz "$build" "$build/tests/gpu_backend_test" \
  "$build/tests/gpu_cluster_test" "$build/bench/nn_step_bench"
case $data in
  mnist)
    mkdir -p .gpu/data/mnist
    cp "$src"/mnist/*-ubyte.gz .gpu/data/mnist/
    ;;
  cifar)
    mkdir -p .gpu/data/cifar10_jpeg .gpu/data/cifar10_partial
    cp "$src/cifar10_jpeg/cifar10-jpeg.tar.gz" .gpu/data/cifar10_jpeg/
    # (pstrain rec cifar10 needs a training batch beside the test batch)
    cp "$src"/cifar10_partial/{classes.txt,test_batch.*,data_batch_2.*} .gpu/data/cifar10_partial/
    ;;
  none) ;;
  *) echo "gpu_prepare: data is mnist, cifar or none, not '$data'" >&2; exit 2 ;;
esac
# What travels: tracked files, untracked ones git does not ignore, and .gpu.
travels=$( (git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- |
  tail -n 1 | cut -f1) 2>/dev/null)
carried=$(du -sb .gpu | cut -f1)
total=$((travels + carried))
echo "gpu_prepare: the working tree ($((travels / 1048576)) MiB) and .gpu ($((carried / 1048576))" \
  "MiB) make $((total / 1048576)) MiB of the device tool's 64"
if ((total > limit)); then
  echo "gpu_prepare: too large to travel: carry less (one data set per call)" >&2
  exit 1
fi
cat <<CALL
The device call (run: carry [".gpu"], timeout_s 600):
  DATA=.gpu/data bash bench/gpu_session.sh .gpu/bundle.tar.gz $phases
CALL
