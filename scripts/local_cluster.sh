#!/usr/bin/env bash
# Starts a whole job on this host by hand, as MXNet's docs do it: one
# scheduler, S servers and W workers, every process running the same
# `pstrain` command with DMLC_ROLE set. Waits for all of them and exits
# non-zero if any failed; each process's output goes to logs/local/<role>-<i>.log
# and the workers' to the terminal too.
#   bash scripts/local_cluster.sh [-s S] [-w W] [-p PORT] -- kvbench --verify
set -euo pipefail
cd "$(dirname "$0")/.."
S=2; W=2; PORT=${DMLC_PS_ROOT_PORT:-9091}
while [[ $# -gt 0 ]]; do
  case "$1" in
    -s) S=$2; shift 2 ;;
    -w) W=$2; shift 2 ;;
    -p) PORT=$2; shift 2 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
[[ $# -gt 0 ]] || { echo "usage: $0 [-s S] [-w W] [-p PORT] -- <pstrain command>" >&2; exit 2; }
BIN=${PSTRAIN_BIN:-build/pstrain}
LOGS=logs/local
mkdir -p "$LOGS"
export DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT=$PORT DMLC_NUM_SERVER=$S DMLC_NUM_WORKER=$W
pids=()
DMLC_ROLE=scheduler "$BIN" "$@" >"$LOGS/scheduler-0.log" 2>&1 & pids+=($!)
for ((i = 0; i < S; i++)); do
  DMLC_ROLE=server "$BIN" "$@" >"$LOGS/server-$i.log" 2>&1 & pids+=($!)
done
for ((i = 0; i < W; i++)); do
  if ((i == 0)); then
    DMLC_ROLE=worker "$BIN" "$@" 2>&1 | tee "$LOGS/worker-$i.log" | grep -v '^[IWE][0-9]' & pids+=($!)
  else
    DMLC_ROLE=worker "$BIN" "$@" >"$LOGS/worker-$i.log" 2>&1 & pids+=($!)
  fi
done
# Every process has its own deadlines (startup, heartbeats), so these waits end.
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
if ((status != 0)); then
  echo "local_cluster: a process failed; see $LOGS/" >&2
  grep -h -E '^E[0-9]' "$LOGS"/*.log | head -5 >&2 || true
fi
exit $status
