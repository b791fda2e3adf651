#!/usr/bin/env bash
# Configures and builds pstrain into ./build (or $PSTRAIN_BUILD_DIR).
# Extra arguments go to cmake's configure step, e.g. -DPSTRAIN_BUILD_TESTS=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${PSTRAIN_BUILD_DIR:-build}
JOBS=${PSTRAIN_JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${PSTRAIN_BUILD_TYPE:-Release} "$@" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
