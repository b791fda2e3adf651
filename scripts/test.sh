#!/usr/bin/env bash
# Quick start, command 2: install what is missing, build, run the whole test suite.
#   bash scripts/test.sh            # all labels
#   bash scripts/test.sh -L unit    # extra arguments go to ctest
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
BUILD_DIR=${PSTRAIN_BUILD_DIR:-build}
cd "$BUILD_DIR"
ctest --output-on-failure --timeout 600 -j "${PSTRAIN_TEST_JOBS:-2}" "$@"
