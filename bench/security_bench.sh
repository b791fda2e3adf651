#!/usr/bin/env bash
# What the job's keys cost: kvbench push+pull on 1 server + 1 worker, over
# loopback TCP only (PSTRAIN_SHM_BYTES=0) and through shared memory, each
# without keys, with keys and PSTRAIN_WIRE_SECURITY=curve (every ZeroMQ frame
# encrypted and authenticated) and with =auth (connections authenticated,
# frames in the clear), interleaved round by round; median of the rounds.
#   bash bench/security_bench.sh [rounds]      (build/pstrain; ~2 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
BIN=${PSTRAIN_BIN:-build/pstrain}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$BIN" keygen "$out/job.key" >/dev/null
port=${SECURITY_BENCH_PORT:-29800}
for ((r = 1; r <= ROUNDS; r++)); do
  for transport in tcp shm; do
    for keys in none curve auth; do
      shm=$([[ $transport == tcp ]] && echo 0 || echo 134217728)
      key=$([[ $keys != none ]] && echo "$out/job.key" || echo "")
      wire=$([[ $keys == auth ]] && echo auth || echo curve)
      PSTRAIN_SHM_BYTES=$shm PSTRAIN_KEY_FILE=$key PSTRAIN_WIRE_SECURITY=$wire PSTRAIN_BIN=$BIN \
        bash scripts/local_cluster.sh -s 1 -w 1 -p "$port" -- kvbench --mode pushpull \
        --tensor-bytes 4096,1048576 --tensors 64,16 --iters 600 2>&1 |
        awk -v t="$transport" -v k="$keys" '/^kvbench: / { for (i = 2; i <= NF; i++) {
          split($i, kv, "="); v[kv[1]] = kv[2] }
          print t, k, v["tensor_bytes"], v["pairs_per_s"], v["payload_gbps"] }' >>"$out/rows"
      port=$((port + 1))
    done
  done
  echo "round $r/$ROUNDS done" >&2
done
echo "| transport | keys | tensor | pairs/s per worker | payload GB/s |"
echo "|---|---|---:|---:|---:|"
for transport in tcp shm; do
  for bytes in 4096 1048576; do
    for keys in none curve auth; do
      awk -v t="$transport" -v k="$keys" -v b="$bytes" '$1 == t && $2 == k && $3 == b' \
        "$out/rows" | sort -k4 -g | awk -v t="$transport" -v k="$keys" -v b="$bytes" '
        { p[NR] = $4; g[NR] = $5 } END { m = int((NR + 1) / 2);
          printf "| %s | %s | %s | %d | %.2f |\n", t, k, (b == 4096 ? "64 x 4 KB" : "16 x 1 MB"), p[m], g[m] }'
    done
  done
done
echo "($ROUNDS interleaved rounds; $(nproc) cores)"
