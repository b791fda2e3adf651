#!/usr/bin/env bash
# Quick start, command 2: install what is missing, build, run the whole test
# suite, then clang's checks (thread-safety analysis, a short run of every
# fuzz harness: scripts/clang_checks.sh).
#   bash scripts/test.sh            # all labels, then clang's checks
#   bash scripts/test.sh -L unit    # extra arguments go to ctest (no clang checks)
#   PSTRAIN_CLANG_CHECKS=0|1        # leave clang's checks out / run them anyway
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
BUILD_DIR=${PSTRAIN_BUILD_DIR:-build}
(cd "$BUILD_DIR" && ctest --output-on-failure --timeout 600 -j "${PSTRAIN_TEST_JOBS:-2}" "$@")
if [[ "${PSTRAIN_CLANG_CHECKS:-$([[ $# -eq 0 ]] && echo 1 || echo 0)}" == "1" ]]; then
  bash scripts/clang_checks.sh
fi
