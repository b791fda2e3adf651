#!/usr/bin/env bash
# Parameter-server benchmark: runs `pstrain kvbench` on local clusters of
# 1 server + 1 worker and 2 servers + 2 workers (every process on this host),
# once with the default transport (shared memory between co-located nodes,
# net/shm_arena.h) and once over loopback TCP only (PSTRAIN_SHM_BYTES=0), and
# prints each worker-0 table; figures go to bench/RESULTS.md.
#   bash bench/kvbench.sh [kvbench flags; default --iters 1500, so a 4 KB round
#                          lasts long enough (~0.1 s) to measure steadily]
#   KVBENCH_TRANSPORTS="shm" bash bench/kvbench.sh   # one transport only
set -euo pipefail
cd "$(dirname "$0")/.."
args=("$@")
((${#args[@]})) || args=(--iters 1500)
for transport in ${KVBENCH_TRANSPORTS:-shm tcp}; do
  shm_bytes=${PSTRAIN_SHM_BYTES:-134217728}
  [[ $transport == tcp ]] && shm_bytes=0
  for sw in "1 1" "2 2"; do
    read -r S W <<<"$sw"
    echo "== $S server(s), $W worker(s), transport $transport"
    PSTRAIN_SHM_BYTES=$shm_bytes bash scripts/local_cluster.sh -s "$S" -w "$W" \
      -p "${KVBENCH_PORT:-29500}" -- kvbench --mode pushpull,sync,async "${args[@]}"
  done
done
