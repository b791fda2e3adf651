#!/usr/bin/env bash
# Every fuzz harness of tests/fuzz/ for a million inputs (clang, address and
# undefined-behaviour sanitizers): the figures of bench/RESULTS.md "Fuzzing".
#   bash bench/fuzz_bench.sh [RUNS]       # default 1000000
# The corpus each run grows is kept in build-clang/fuzz/<harness>/corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "command: bash bench/fuzz_bench.sh ${1:-1000000}   ($(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
exec bash scripts/clang_checks.sh "${1:-1000000}"
