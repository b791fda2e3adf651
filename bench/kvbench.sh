#!/usr/bin/env bash
# Parameter-server benchmark: runs `pstrain kvbench` on local clusters of
# 1 server + 1 worker and 2 servers + 2 workers (every process on this host,
# loopback TCP) and prints each worker-0 table; figures go to bench/RESULTS.md.
#   bash bench/kvbench.sh [extra kvbench flags, e.g. --iters 600]
set -euo pipefail
cd "$(dirname "$0")/.."
for sw in "1 1" "2 2"; do
  read -r S W <<<"$sw"
  echo "== $S server(s), $W worker(s)"
  bash scripts/local_cluster.sh -s "$S" -w "$W" -p "${KVBENCH_PORT:-29500}" -- \
    kvbench --mode pushpull,sync,async "$@"
done
