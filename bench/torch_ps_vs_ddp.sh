#!/usr/bin/env bash
# PyTorch on 2 workers of this host: pstrain's DistributedOptimizer (dist_sync,
# 1 and 2 servers) versus DistributedDataParallel over gloo, side by side.
#
#   bash bench/torch_ps_vs_ddp.sh [ROUNDS] [BUILD_DIR]
#
# For lenet and mlp (bench/torch_models.py; MNIST images, the same per-worker
# batch, SGD lr 0.05 momentum 0.9 wd 1e-4) every configuration runs ROUNDS
# times (default 3), interleaved; each figure is the median over the rounds:
#   pstrain S=1, S=2   bench/torch_ps_vs_ddp.py --mode ps under `pstrain launch -n 2 -s S`
#   DDP                --mode ddp, 2 processes, gloo on 127.0.0.1
#   compute            --mode local, 2 processes at once (no communication)
#   comm               --mode comm-ps / comm-ddp: only a step's exchange
# Communication hidden = 1 - waited / in flight, both measured in the run:
# in flight = per step, the time some exchange was under way (pstrain: from the
# gradient hook to the servers' answer; DDP: each bucket's all-reduce, timed by
# a comm hook doing what DDP's default does); waited = the part training
# waited for (pstrain: the waits before a layer's forward; DDP: backward's wait
# after its last all-reduce launch). "alone": the same exchange with no
# compute beside it; "compute": the step with no communication.
# Every worker gets OMP_NUM_THREADS = cores / 2, as `pstrain launch` gives.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
BUILD=${2:-build}
PY=/usr/bin/python3
DATA=${PSTRAIN_SHARED_DATA_DIR:-../shared/data}/mnist
BATCH=${BATCH:-64}
export PYTHONPATH=$PWD/$BUILD/python
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
THREADS=$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))
[ -x "$BUILD/pstrain" ] && [ -d "$BUILD/python/pstrain" ] || {
  echo "build first: $BUILD/pstrain and $BUILD/python/pstrain (pybind11-dev, python3-dev)" >&2
  exit 1
}
LOGS=$(mktemp -d /tmp/torch_ps_vs_ddp.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$LOGS"
}
trap cleanup EXIT

steps_for() { [ "$1" = lenet ] && echo 100 || echo 400; }

# ps|comm-ps NETWORK SERVERS -> the bench: line of worker 0
ps_run() {
  local out
  out=$("$BUILD/pstrain" launch -n 2 -s "$3" --launcher local --log-dir "$LOGS/ps" -- \
        "$PY" bench/torch_ps_vs_ddp.py --mode "$1" --network "$2" --batch-size "$BATCH" \
        --steps "$(steps_for "$2")" --data-dir "$DATA" 2>&1) || { echo "$out" >&2; exit 1; }
  grep -o 'bench: .*' <<<"$out" | head -1
}
# ddp|comm-ddp|local NETWORK -> the bench: line of rank 0 (2 processes at once)
pair_run() {
  local port=$((20000 + RANDOM % 10000)) r
  PIDS=()
  for r in 0 1; do
    OMP_NUM_THREADS=$THREADS RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$PY" bench/torch_ps_vs_ddp.py --mode "$1" --network "$2" --batch-size "$BATCH" \
      --steps "$(steps_for "$2")" --data-dir "$DATA" >"$LOGS/pair-$r.log" 2>&1 &
    PIDS+=($!)
  done
  for p in "${PIDS[@]}"; do wait "$p" || { cat "$LOGS"/pair-*.log >&2; exit 1; }; done
  PIDS=()
  grep -o 'bench: .*' "$LOGS/pair-0.log" | head -1
}

echo "host: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); batch $BATCH per worker;" \
     "OMP_NUM_THREADS=$THREADS; $ROUNDS rounds; $(date -u '+%F %H:%M UTC')"
RESULTS=$LOGS/results
: >"$RESULTS"
for ((round = 0; round < ROUNDS; ++round)); do
  for net in lenet mlp; do
    # Each round runs every configuration once, back to back, so that a
    # round's figures share the machine's load of the moment.
    for s in 1 2; do
      echo "$round $net ps$s $(ps_run ps "$net" "$s")" >>"$RESULTS"
      echo "$round $net comm-ps$s $(ps_run comm-ps "$net" "$s")" >>"$RESULTS"
    done
    echo "$round $net ddp $(pair_run ddp "$net")" >>"$RESULTS"
    echo "$round $net comm-ddp $(pair_run comm-ddp "$net")" >>"$RESULTS"
    echo "$round $net local $(pair_run local "$net")" >>"$RESULTS"
    echo "  round $round $net done" >&2
  done
done

# Medians over the rounds; "vs DDP": the median of each round's ratio.
python3 - "$RESULTS" <<'PY'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    rnd, net, cfg, rest = line.split(" ", 3)
    runs.setdefault((net, cfg), {})[int(rnd)] = {
        k: float(v) for k, v in re.findall(r"(\w+)=([0-9.]+)", rest)}
med = lambda net, cfg, key: statistics.median(r[key] for r in runs[(net, cfg)].values())
print()
print("| network | system | samples/s (2 workers) | vs DDP | ms/step | compute ms/step | "
      "exchange alone ms/step | in flight ms/step | waited ms/step | comm hidden |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
names = {"ps1": "pstrain, 1 server", "ps2": "pstrain, 2 servers", "ddp": "DDP (gloo)"}
for net in ("lenet", "mlp"):
    ddp = runs[(net, "ddp")]
    for cfg in ("ps1", "ps2", "ddp"):
        r = runs[(net, cfg)]
        ratio = statistics.median(r[k]["samples_per_s"] / ddp[k]["samples_per_s"] for k in r)
        comm, waited = med(net, cfg, "comm_ms"), med(net, cfg, "wait_ms")
        # DDP's waited time also holds its copy of the averaged buckets into the
        # gradients, which no all-reduce interval covers: it can exceed "in flight".
        hidden = "%.0f%%" % (100 * max(0.0, 1 - waited / comm)) if comm > 0 else "-"
        print("| %s | %s | %.0f | %.2fx | %.1f | %.1f | %.2f | %.2f | %.2f | %s |" % (
            net, names[cfg], med(net, cfg, "samples_per_s"), ratio, med(net, cfg, "step_ms"),
            med(net, "local", "step_ms"), med(net, "comm-" + cfg, "step_ms"), comm, waited,
            hidden))
PY
