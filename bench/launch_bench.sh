#!/usr/bin/env bash
# Launcher and parse-log figures: start-up/shut-down overhead of a 2-server
# 2-worker job, output forwarding throughput, and parse-log throughput.
#   bash bench/launch_bench.sh [build/pstrain]
set -euo pipefail
PSTRAIN=$(readlink -f "${1:-build/pstrain}")
LOGS=$(readlink -f "$(dirname "$0")/../../shared/data/mxnet-logs")
TMP=$(mktemp -d /tmp/pstrain-bench-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
now() { date +%s.%N; }
ms() { echo "($2 - $1) * 1000" | bc -l; }

MPI_FLAGS=(--mpi-option --oversubscribe)
if [[ $(id -u) -eq 0 ]]; then MPI_FLAGS+=(--mpi-option --allow-run-as-root); fi
echo '127.0.0.1 slots=16' > hosts

echo "| what | figure |"
echo "| --- | --- |"
# 1. Overhead: a job of `true` (1 scheduler, 2 servers, 2 workers), mean of 20.
for launcher in local mpi; do
  extra=()
  if [[ $launcher == mpi ]]; then extra=(-H hosts "${MPI_FLAGS[@]}"); fi
  t0=$(now)
  for i in $(seq 20); do
    "$PSTRAIN" launch -n 2 -s 2 --launcher $launcher --quiet --log-dir "l$i" "${extra[@]}" -- true 2>/dev/null
  done
  t1=$(now)
  printf "| %s launch, 2s+2w job of \`true\`, start to exit | %.1f ms |\n" $launcher \
    "$(echo "$(ms "$t0" "$t1") / 20" | bc -l)"
done

# 2. Output forwarding: 5 processes each print 200000 lines of 80 bytes (80 MB in all).
LINE='INFO:root:Epoch[0] Batch [100]\tSpeed: 1234.56 samples/sec\taccuracy=0.123456xx'
GEN="yes '$LINE' | head -n 200000"
t0=$(now)
for i in 1 2 3 4 5; do sh -c "$GEN" > /dev/null & done
wait
t1=$(now)
direct=$(ms "$t0" "$t1")
t0=$(now)
"$PSTRAIN" launch -n 2 -s 2 --launcher local --log-dir fwd -- sh -c "$GEN" > /dev/null 2>&1
t1=$(now)
launched=$(ms "$t0" "$t1")
bytes=$(cat fwd/*.log | wc -c)
printf "| 5 processes x 200000 lines, run directly to /dev/null | %.0f ms |\n" "$direct"
printf "| same under launch (terminal /dev/null + 5 log files, %d MB) | %.0f ms (%.0f MB/s) |\n" \
  $((bytes / 1000000)) "$launched" "$(echo "$bytes / 1000 / $launched" | bc -l)"

# 3. parse-log: every MXNet log concatenated 200 times (interleaved workers).
for i in $(seq 200); do cat "$LOGS"/cifar10/* "$LOGS"/ilsvrc12/*; done > big.log
bytes=$(wc -c < big.log)
t0=$(now)
"$PSTRAIN" parse-log big.log > /dev/null
t1=$(now)
t=$(ms "$t0" "$t1")
printf "| parse-log of %d MB of MXNet logs | %.0f ms (%.0f MB/s) |\n" $((bytes / 1000000)) "$t" \
  "$(echo "$bytes / 1000 / $t" | bc -l)"
