#!/usr/bin/env bash
# Configures and builds pstrain into ./build (or $PSTRAIN_BUILD_DIR).
#   PSTRAIN_BUILD_TARGET=pstrain   build one target instead of everything
#   PSTRAIN_JOBS=N                 parallel compile jobs (default: all cores)
# Extra arguments go to cmake's configure step, e.g. -DPSTRAIN_ARCH=native.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${PSTRAIN_BUILD_DIR:-build}
JOBS=${PSTRAIN_JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${PSTRAIN_BUILD_TYPE:-Release} "$@" >/dev/null
if [[ -n "${PSTRAIN_BUILD_TARGET:-}" ]]; then
  cmake --build "$BUILD_DIR" -j "$JOBS" --target "$PSTRAIN_BUILD_TARGET"
else
  cmake --build "$BUILD_DIR" -j "$JOBS"
fi
