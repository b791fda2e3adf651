#!/usr/bin/env bash
# Prepares a GPU session's device calls here, on the development machine, so
# that device time goes to runs only: checks the phases and their data,
# bundles the build (scripts/bundle.sh, with the gpu test binaries and
# nn_step_bench; the CUDA module is required) into .gpu/bundle.tar.gz, lays
# the data the phases need in .gpu/data, checks that what travels fits the
# device tool's 64 MiB, and prints the call to make.
#   bash bench/gpu_prepare.sh [build_dir] [mnist|cifar|none] [phases]
#   e.g. bash bench/gpu_prepare.sh build mnist tests,models   (the default)
#        bash bench/gpu_prepare.sh build cifar seed001
# mnist: MNIST (the tests phase); cifar: the CIFAR-10 JPEG set and, for
# torch_3's exact test images, cifar10_partial's test batch, classes and one
# training batch (the seed001 phase); the bundle and one of them fit, not
# both. DATA: where they are read from (../shared/data by default).
# CALL_S: the call's timeout_s (540 unless set; the device tool's limit is
# the smaller of it and the device time left, the machine's start included):
# the printed call sets DEADLINE_S 30 s below it.
# .gpu/ is ignored by git: the call must name it in `carry`.
set -euo pipefail
build=${1:-build}
data=${2:-mnist}
phases=${3:-tests,models}
call_s=${CALL_S:-540}
cd "$(dirname "$0")/.."
src=${DATA:-../shared/data}
limit=$((64 * 1024 * 1024))
fail() {
  echo "gpu_prepare: $*" >&2
  exit 2
}
# What gpu_session.sh would refuse on the GPU machine, after its paid start.
IFS=, read -ra list <<<"$phases"
((${#list[@]} >= 1 && ${#list[@]} <= 3)) || fail "1 to 3 phases, not '$phases'"
for p in "${list[@]}"; do
  case $p in
    tests) [[ $data == mnist ]] || fail "the tests phase needs the mnist data, not '$data'" ;;
    seed001) [[ $data == cifar ]] || fail "the seed001 phase needs the cifar data, not '$data'" ;;
    step | profile | merge | models) ;;
    *) fail "unknown phase '$p' (tests, step, profile, merge, models, seed001)" ;;
  esac
done
((call_s >= 120 && call_s <= 600)) || fail "CALL_S is 120 to 600 s, not $call_s"
[[ -f $build/libpstrain_cuda.so ]] ||
  fail "$build/libpstrain_cuda.so is missing: a build with CUDA (nvcc found) makes it"
git check-ignore -q .gpu/x || fail ".gpu/ is not ignored by git"
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
  *) fail "data is mnist, cifar or none, not '$data'" ;;
esac
# What travels: tracked files (those still there) and untracked ones git does
# not ignore, and .gpu.
travels=0
while IFS= read -r -d '' f; do
  [[ -f $f ]] && travels=$((travels + $(stat -c %s "$f")))
done < <(git ls-files -z --cached --others --exclude-standard)
carried=$(du -sb .gpu | cut -f1)
total=$((travels + carried))
echo "gpu_prepare: the working tree ($((travels / 1048576)) MiB) and .gpu ($((carried / 1048576))" \
  "MiB) make $((total / 1048576)) MiB of the device tool's 64"
((total <= limit)) || fail "too large to travel: carry less (one data set per call)"
cat <<CALL
The device call (run: carry [".gpu"], timeout_s $call_s; with less device time
left than that and the machine's start, lower CALL_S and prepare again):
  DEADLINE_S=$((call_s - 30)) DATA=.gpu/data bash bench/gpu_session.sh .gpu/bundle.tar.gz $phases
CALL
