#!/usr/bin/env bash
# The GPU figures of issues 10 and 11, on a GPU host that has CUDA and
# PyTorch but none of our packages, in phases that each fit a 10-minute
# command. On the development machine, bundle the build:
#   bash scripts/bundle.sh BUNDLE.tar.gz build build/tests/gpu_backend_test \
#     build/tests/gpu_cluster_test build/bench/nn_step_bench
# (bench/gpu_prepare.sh does that and lays the data beside it in .gpu/, and
# prints the device call to make) and on the GPU host, from a copy of this
# checkout:
#   bash bench/gpu_session.sh BUNDLE.tar.gz PHASE[,PHASE...] [args]
# Several phases run one after another in one call (each with its defaults;
# args only with one phase), sharing DEADLINE_S: the seconds of this script by
# which every phase has ended and its logs are packed (570 unless set: the
# device call's 10 minutes less the start), so no run is killed by the call's
# limit with its logs unpacked. The tests phase takes at most TESTS_S (300).
# PHASE:
#   tests    the `gpu` test binaries, a process per test suite (the cluster
#            test needs MNIST: DATA)
#   step [ROUNDS]   bench/gpu_vs_pytorch.sh, 3 rounds unless given
#   profile  nn_step_bench --profile (device time per layer) and
#            torch_step_bench.py --profile (device time per operator and kernel)
#            of ResNet-50 at batch 32 and inception-bn-28-small at batch 256, the
#            two rows nearest PyTorch's, and those two rows with cuDNN's graph
#            engines raced (the default) against the legacy algorithms alone
#   merge    bench/gpu_merge_bench.sh (lenet and resnet)
#   models [EPOCHS] [BATCHES]   bench/gpu_models.sh: `pstrain train --gpus 0` on
#            every model, synthetic data (2 epochs of 20 batches unless given)
#   seed001 [RUNS] [EPOCHS] [SECONDS]   bench/gpu_seed001.sh (needs the CIFAR-10
#            JPEG set: DATA); by default incept_6, 40 epochs, at most 500 s:
#            one run of 10 workers fits a call (about 8 s an epoch on an H100);
#            the runs owed: incept_6 incept_7 incept_4 async; single-GPU runs
#            go two to a call with PARALLEL=1 (gpu_seed001.sh runs them at once
#            on the GPU): incept_3_fixed (incept_3 in the file's order) and
#            torch_3 (incept_3 in PyTorch on the same files) took 430 s so
#            (docs/reproductions.md)
# DATA: the data folder (../shared/data by default, which the device tool
# does not carry: name a copy inside the checkout, such as gpu_prepare.sh's
# .gpu/data, in the call's `carry` and set DATA to it; the tests and seed001
# phases check it first): mnist/, cifar10_jpeg/, and for torch_3's exact test
# images cifar10_partial/'s classes.txt, test_batch.* and one data_batch_N.*
# that `pstrain rec cifar10` needs.
# Logs and tables go to $OUT (the device tool's output folder) or ./gpu-out:
# version.txt, and a phase's PHASE.md (its table or summary) and
# PHASE-logs.tar.gz (every run's log): at most 3 phases a call, so that no
# more than the 8 files the device tool brings back are written.
# A phase stops at once (exit 3) when the bundle's pstrain sees no usable GPU.
set -uo pipefail
phases="tests|step|profile|merge|models|seed001"
usage="usage: bash bench/gpu_session.sh BUNDLE.tar.gz PHASE[,PHASE...] [args] (PHASE: $phases)"
bundle=${1:?$usage}
phase_list=${2:?$usage}
shift 2
IFS=, read -ra PHASES <<<"$phase_list"
for phase in "${PHASES[@]}"; do
  [[ $phase =~ ^($phases)$ ]] || {
    echo "gpu_session: unknown phase '$phase' ($phases)" >&2
    exit 2
  }
done
if ((${#PHASES[@]} > 3)); then
  echo "gpu_session: at most 3 phases a call (two files each and version.txt: 8 come back)" >&2
  exit 2
fi
if ((${#PHASES[@]} != 1 && $# > 0)); then
  echo "gpu_session: arguments go with one phase only (several take their defaults)" >&2
  exit 2
fi
cd "$(dirname "$0")/.." || exit 1
DEADLINE_S=${DEADLINE_S:-570}
out=${OUT:-gpu-out}
mkdir -p "$out"
export PSTRAIN_SHARED_DATA_DIR=${DATA:-../shared/data}
need_data() {
  [[ -e $PSTRAIN_SHARED_DATA_DIR/$1 ]] && return 0
  echo "gpu_session: the $2 phase needs $PSTRAIN_SHARED_DATA_DIR/$1 (set DATA to a data" \
    "folder carried to this machine)" >&2
  exit 2
}
for phase in "${PHASES[@]}"; do
  case $phase in
    tests) need_data mnist tests ;;
    seed001) need_data cifar10_jpeg/cifar10-jpeg.tar.gz seed001 ;;
  esac
done
# left [CAP]: the seconds this script has left before DEADLINE_S, less 15 for
# packing the logs, and at most CAP; 0 when none.
left() {
  local l=$((DEADLINE_S - SECONDS - 15))
  if (($# > 0)) && (($1 < l)); then l=$1; fi
  echo $((l > 0 ? l : 0))
}
unpacked=$(mktemp -d)
# Every phase keeps its runs' logs in $unpacked/logs/PHASE-logs, each packed
# into one file at the end (also when the call's limit sends a TERM).
mkdir -p "$unpacked/logs"
pack_logs() {
  local d
  for d in "$unpacked"/logs/*-logs; do
    [[ -d $d ]] && tar -C "$unpacked/logs" -czf "$out/${d##*/}.tar.gz" "${d##*/}"
  done
  rm -rf "$unpacked"
}
trap pack_logs EXIT
# (a TERM from the call's limit packs what there is; DEADLINE_S is what keeps
# the runs inside the call: a run under `timeout` is in a process group of its
# own and would not get the TERM)
trap 'exit 143' TERM
tar -C "$unpacked" -xaf "$bundle" || exit 1
# shellcheck disable=SC1091
. "$unpacked/pstrain-bundle/env.sh"
bin=$unpacked/pstrain-bundle/bin
export PSTRAIN_BINARY=$bin/pstrain PSTRAIN_CUDA_MODULE=$bin/libpstrain_cuda.so
# A GPU test that cannot use the GPU here fails rather than skips.
export PSTRAIN_REQUIRE_GPU=1
pstrain version | tee "$out/version.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$out/version.txt"
if ! grep -qE 'GPUs: [1-9]' "$out/version.txt"; then
  echo "gpu_session: the bundle's pstrain sees no usable GPU (above); nothing run" >&2
  exit 3
fi

# run_suites BINARY LOG: each test suite of a GoogleTest binary in its own
# process, so that a crash or a sticky CUDA error (a kernel fault poisons its
# context) costs only its suite; a suite that does not pass has its failed
# tests (all of them, if it crashed or hung) run again one per process
# (LOG.rerun), and those runs say which tests fail. Prints a
# line per suite and per rerun test, then the counts; returns 1 if a test
# failed on its own.
# Every run is bounded by what is left of the phase's time (`left`, capped
# at $tests_end): a suite or test not started for want of it is named.
# phase_time CAP WHAT: sets t to that time, at most CAP s; under 10 s, says
# WHAT was not run and fails.
phase_time() {
  t=$(left $((tests_end - SECONDS < $1 ? tests_end - SECONDS : $1)))
  ((t >= 10)) && return 0
  echo "$2 not run: the phase's time is up"
  return 1
}
run_suites() {
  local binary=$1 log=$2 suite suites test failed rc=0 status t timed='.* \([0-9]+ ms\)$'
  : >"$log"
  : >"$log.rerun"
  if [[ ! -x $binary ]] || ! suites=$("$binary" --gtest_list_tests 2>>"$log"); then
    echo "FAIL  $binary is missing from the bundle or does not start: $(tail -n 3 "$log")"
    return 1
  fi
  suites=$(awk '/^[^ ]/ && !/^Running main/' <<<"$suites")
  if [[ -z $suites ]]; then
    echo "FAIL  $binary lists no test suite"
    return 1
  fi
  # A hung suite (a fence, a peer copy) must not take the call's 10 minutes:
  # each suite gets at most 150 s of what is left.
  for suite in $suites; do
    phase_time 150 "FAIL  $suite*" || { rc=1; continue; }
    timeout -k 10 "$t" "$binary" --gtest_filter="$suite*" >"$log.suite" 2>&1
    status=$?
    cat "$log.suite" >>"$log"
    if ((status == 0)); then
      echo "pass  $suite*"
      continue
    fi
    # A suite that ended by itself names its failed tests: those alone run
    # again, each in its own process. One that crashed or hung: all of them,
    # to find which.
    failed=$(sed -nE "s/^\[  FAILED  \] ([^ ,]+)(, where .*)? \([0-9]+ ms\)$/\1/p" "$log.suite")
    if ((status == 1)) && [[ -n $failed ]]; then
      echo "FAIL  $suite*: the failed tests, each alone"
    else
      echo "FAIL  $suite* (exit $status$( ((status == 124)) && echo ", timed out")): one test" \
        "per process"
      failed=$("$binary" --gtest_list_tests --gtest_filter="$suite*" |
        awk -v s="$suite" '/^  /{print s $1}')
    fi
    for test in $failed; do
      phase_time 120 "  FAIL  $test and the rest of them" || { rc=1; break; }
      timeout -k 10 "$t" "$binary" --gtest_filter="$test" >>"$log.rerun" 2>&1
      status=$?
      if ((status == 0)); then
        echo "  pass  $test"
      else
        echo "  FAIL  $test (exit $status)"
        rc=1
      fi
    done
  done
  rm -f "$log.suite"
  echo "$(grep -cE "^\[       OK \] $timed" "$log") passed," \
    "$(grep -cE "^\[  SKIPPED \] $timed" "$log") skipped," \
    "$(grep -cE "^\[  FAILED  \] $timed" "$log") failed in the suites' processes"
  grep -m 1 -B 2 -E "^\[  SKIPPED \] $timed" "$log" | head -n 2
  return $rc
}

# run_phase PHASE [args]: one phase; its status.
run_phase() {
  local phase=$1 logs=$unpacked/logs/$1-logs rc=0
  shift
  mkdir -p "$logs"
  echo "== $phase (at ${SECONDS} s of $DEADLINE_S)"
  case $phase in
  tests)
    tests_end=$((SECONDS + ${TESTS_S:-300}))
    (
      failed=0
      # The cluster tests first: they are the only runs of `train`, `summary`
      # and dist jobs with the graph engines raced (the default), and the
      # backend test's eight-model step comes near the phase's time.
      for t in gpu_cluster_test gpu_backend_test; do
        echo "### $t"
        run_suites "$bin/$t" "$logs/$t.log" || failed=1
      done
      exit $failed
    ) 2>&1 | tee "$out/tests.md"
    rc=${PIPESTATUS[0]}
    ;;
  step)
    # A round of the seven rows takes minutes: no round starts that its
    # predecessor says would end past what is left (BUDGET_S), and the bench
    # is stopped there anyway.
    t=$(left)
    if ((t < 60)); then
      echo "step not run: the phase's time is up" | tee "$out/step.md"
      rc=1
    else
      NN_STEP_BENCH=$bin/nn_step_bench LOG_DIR=$logs BUDGET_S=${BUDGET_S:-$((t - 10))} \
        timeout -k 10 "$t" bash bench/gpu_vs_pytorch.sh "$bin" "${1:-3}" 2>&1 | tee "$out/step.md"
      rc=${PIPESTATUS[0]}
    fi
    ;;
  profile)
    # Device time per layer (pstrain) and per operator and kernel (PyTorch's
    # profiler) of the two rows nearest PyTorch's, side by side.
    resnet=(--network resnet --num-layers 50 --image-shape "3,224,224" --num-classes 1000 --batch 32)
    incept=(--network inception-bn-28-small --image-shape "3,28,28" --num-classes 10 --batch 256)
    # Each run within 100 s and what is left (bounded: one that would get
    # under 20 s is not started); the profiles go to the logs, their tails
    # and the race's rows to profile.md.
    bounded() {
      local t
      t=$(left 100)
      if ((t < 20)); then
        echo "$1 not run: the phase's time is up"
        return 1
      fi
      shift
      timeout -k 10 "$t" "$@"
    }
    {
      bounded profile_resnet50 "$bin/nn_step_bench" --gpus 0 "${resnet[@]}" --steps 10 \
        --profile >"$logs/profile_resnet50.md" 2>&1 || echo "profile_resnet50 failed (exit $?)"
      bounded profile_incept256 "$bin/nn_step_bench" --gpus 0 "${incept[@]}" --steps 10 \
        --profile >"$logs/profile_incept256.md" 2>&1 || echo "profile_incept256 failed (exit $?)"
      bounded torch_profile_resnet50 "${PYTHON:-python3}" bench/torch_step_bench.py \
        --device cuda "${resnet[@]}" --steps 20 --profile 5 \
        >"$logs/torch_profile_resnet50.md" 2>&1 || echo "torch_profile_resnet50 failed (exit $?)"
      bounded torch_profile_incept256 "${PYTHON:-python3}" bench/torch_step_bench.py \
        --device cuda "${incept[@]}" --steps 20 --profile 5 \
        >"$logs/torch_profile_incept256.md" 2>&1 ||
        echo "torch_profile_incept256 failed (exit $?)"
      # cuDNN's graph-API engines racing the legacy algorithms (the default),
      # beside the legacy search alone (--no-conv-graph), interleaved.
      # (a second round only where the time left leaves room for it)
      for r in 1 2; do
        ((r == 1 || $(left) > 200)) || break
        for rows in resnet incept; do
          declare -n row=$rows
          for flag in --no-conv-graph ""; do
            echo "round $r: $rows ${flag:-graph engines raced}"
            # shellcheck disable=SC2086
            bounded "$rows $flag" "$bin/nn_step_bench" --gpus 0 "${row[@]}" --steps 30 $flag 2>&1 |
              grep -E '^\| [a-z]|^on cuda|rror|FATAL|Check failed|not run'
          done
          unset -n row
        done
      done
      tail -n 30 "$logs"/profile_*.md
      tail -n 45 "$logs"/torch_profile_*.md
    } 2>&1 | tee "$out/profile.md"
    grep -qE 'failed \(exit|not run' "$out/profile.md" && rc=1
    ;;
  merge)
    if (($(left) < 60)); then
      echo "merge not run: the phase's time is up" | tee "$out/merge.md"
      rc=1
    else
      LOG_DIR=$logs timeout -k 10 "$(left)" bash bench/gpu_merge_bench.sh "$bin/pstrain" \
        "lenet resnet" 2>&1 | tee "$out/merge.md"
      rc=${PIPESTATUS[0]}
    fi
    ;;
  models)
    LOG_DIR=$logs DEADLINE_S=$(left) bash bench/gpu_models.sh "$bin/pstrain" 0 "${1:-2}" \
      "${2:-20}" 2>&1 | tee "$out/models.md"
    rc=${PIPESTATUS[0]}
    ;;
  seed001)
    LOG_DIR=$logs DEADLINE_S=$(left) bash bench/gpu_seed001.sh "$bin/pstrain" \
      "${1:-incept_6}" "${2:-40}" "${3:-500}" 2>&1 | tee "$out/seed001.md"
    rc=${PIPESTATUS[0]}
    ;;
  esac
  echo "== $phase: exit $rc (at ${SECONDS} s)"
  return $rc
}

rc=0
for phase in "${PHASES[@]}"; do
  run_phase "$phase" "$@"
  ((rc |= $?))
done
exit $rc
