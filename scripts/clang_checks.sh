#!/usr/bin/env bash
# Clang's checks, run by the test command after the test suite:
#   - the thread-safety analysis of our GUARDED_BY / REQUIRES annotations
#     (common/thread_annotations.h), as errors, over all of pstrain's code;
#   - every libFuzzer harness of tests/fuzz/ (address and undefined-behaviour
#     sanitizers on), for RUNS inputs grown from its seeds.
# A crash leaves its input in $BUILD_DIR/fuzz/<harness>/crash-*; replay it with
#   $BUILD_DIR/tests/fuzz/fuzz_<harness> CRASH_FILE
#
#   bash scripts/clang_checks.sh [RUNS]     # RUNS defaults to 20000 per harness
#   PSTRAIN_CLANG_BUILD_DIR=...             # default build-clang
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-20000}
BUILD_DIR=${PSTRAIN_CLANG_BUILD_DIR:-build-clang}
JOBS=${PSTRAIN_BUILD_JOBS:-$(nproc)}

for tool in clang clang++; do
  if ! command -v "$tool" >/dev/null; then
    echo "clang_checks: $tool not found (bash scripts/install-deps.sh installs it)" >&2
    exit 1
  fi
done

# CUDA off: nvcc does not take clang's sanitizer flags; the CUDA backend is a
# module of its own (nn/cuda/) that the main build compiles.
mkdir -p "$BUILD_DIR"
CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPSTRAIN_FUZZ=ON -DPSTRAIN_THREAD_SAFETY=ON -DPSTRAIN_WITH_CUDA=OFF -DPSTRAIN_BUILD_TESTS=OFF \
  >"$BUILD_DIR/configure.log" 2>&1 || { cat "$BUILD_DIR/configure.log" >&2; exit 1; }
echo "clang_checks: building all of pstrain with clang (thread-safety analysis as errors)"
cmake --build "$BUILD_DIR" -j "$JOBS" >"$BUILD_DIR/build.log" 2>&1 ||
  { grep -E "error|Error" "$BUILD_DIR/build.log" | head -50 >&2; echo "clang_checks: build failed, see $BUILD_DIR/build.log" >&2; exit 1; }
echo "clang_checks: thread-safety analysis: no findings"

FUZZ_BIN="$BUILD_DIR/tests/fuzz"
WORK="$BUILD_DIR/fuzz"
rm -rf "$WORK/seeds"
"$FUZZ_BIN/make_seeds" "$WORK/seeds"
failed=()
printf '%-10s %10s %8s %8s %8s %8s %8s\n' harness runs seconds execs/s cov corpus rss_mb
for name in wire recordio readers image config tar; do
  dir="$WORK/$name"
  mkdir -p "$dir/corpus"
  log="$dir/run.log"
  start=$(date +%s%N)
  # -rss_limit_mb: a reader that allocates what a corrupt header asks for fails here.
  if ! "$FUZZ_BIN/fuzz_$name" "$dir/corpus" "$WORK/seeds/$name" -runs="$RUNS" -max_len=4096 \
      -rss_limit_mb=2048 -timeout=20 -artifact_prefix="$dir/" -print_final_stats=1 >"$log" 2>&1; then
    failed+=("$name")
    echo "clang_checks: fuzz_$name FAILED:" >&2
    grep -E -A25 "ERROR|runtime error" "$log" | head -40 >&2 || tail -40 "$log" >&2
    ls "$dir"/crash-* "$dir"/oom-* "$dir"/timeout-* 2>/dev/null >&2 || true
    continue
  fi
  ms=$((($(date +%s%N) - start) / 1000000))
  ms=$((ms > 0 ? ms : 1))
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | awk '{print $2}')
  corp=$(grep -oE 'corp: [0-9]+' "$log" | tail -1 | awk '{print $2}')
  rss=$(grep -oE 'stat::peak_rss_mb: *[0-9]+' "$log" | awk '{print $2}')
  printf '%-10s %10s %8s %8s %8s %8s %8s\n' "$name" "$RUNS" "$(awk "BEGIN{printf \"%.1f\", $ms/1000}")" \
    $((RUNS * 1000 / ms)) "$cov" "$corp" "$rss"
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "clang_checks: fuzzing found problems in: ${failed[*]}" >&2
  exit 1
fi
echo "clang_checks: all harnesses ran $RUNS inputs without a finding"
