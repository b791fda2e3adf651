#!/usr/bin/env bash
# One training step (forward + backward + SGD, batch 128, synthetic data) of
# the seeds' networks: pstrain's engine (bench/nn_step_bench) and PyTorch
# (bench/torch_step_bench.py, the same networks from bench/torch_models.py with
# their parameter counts asserted equal to pstrain's), interleaved for ROUNDS
# rounds so both see the same machine load. Each run reports its median step;
# the summary gives the median over rounds and pstrain's ratio to PyTorch's
# best row of the same network.
#   bash bench/nn_vs_torch.sh [build_dir] [rounds] [networks]
#   networks: a comma list of lenet, mlp, resnet (ResNet-20, 3x28x28),
#             inception (inception-bn-28-small, 3x28x28); default all four
# Rows: pstrain with its defaults (channel-blocked layouts, batch norm + ReLU
# fused) and, for the CIFAR networks, with --plain-layouts --no-fusion (every
# tensor NCHW, each convolution reordering at its boundary, as before issue
# 17); PyTorch on 2 threads in NCHW and channels_last (CIFAR networks), or on
# 2 and 1 threads (LeNet, MLP).
set -euo pipefail
BUILD=${1:-build}
ROUNDS=${2:-3}
NETS=${3:-lenet,mlp,resnet,inception}
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
ROWS=$(mktemp)
trap 'rm -f "$ROWS"' EXIT

row() {  # label, then the command; appends "label|ms|cpu ms|samples/s"
  local label=$1
  shift
  local line
  line=$("$@" | grep '^| [a-z]' | grep -v '^| network' | head -1)
  echo "$line" >&2
  echo "$line" | awk -F'|' -v l="$label" '{gsub(/ /, "", $6); gsub(/ /, "", $7); gsub(/ /, "", $8);
    print l "|" $6 "|" $7 "|" $8}' >>"$ROWS"
}

for round in $(seq "$ROUNDS"); do
  for net in ${NETS//,/ }; do
    case $net in
      lenet | mlp)
        steps=30
        [ "$net" = mlp ] && steps=200
        row "$net|pstrain|auto" "$BUILD/bench/nn_step_bench" --network "$net" --steps "$steps" --threads 0
        row "$net|pstrain|1" "$BUILD/bench/nn_step_bench" --network "$net" --steps "$steps" --threads 1
        for t in 2 1; do
          row "$net|PyTorch|$t" $PY bench/torch_step_bench.py --network "$net" --steps "$steps" --threads "$t"
        done
        ;;
      resnet | inception)
        if [ "$net" = resnet ]; then
          ours=(--network resnet --num-layers 20 --image-shape 3,28,28 --steps 20)
          theirs=(--network resnet --num-layers 20 --image-shape 3,28,28 --steps 20 --check-params 272544)
        else
          ours=(--network inception-bn-28-small --image-shape 3,28,28 --steps 8)
          theirs=(--network inception-bn-28-small --image-shape 3,28,28 --steps 8 --check-params 1652826)
        fi
        row "$net|pstrain|auto" "$BUILD/bench/nn_step_bench" "${ours[@]}"
        row "$net|pstrain plain NCHW, unfused|auto" "$BUILD/bench/nn_step_bench" "${ours[@]}" \
          --plain-layouts --no-fusion
        row "$net|PyTorch NCHW|2" $PY bench/torch_step_bench.py "${theirs[@]}" --threads 2
        row "$net|PyTorch channels_last|2" $PY bench/torch_step_bench.py "${theirs[@]}" --threads 2 \
          --channels-last
        ;;
      *)
        echo "unknown network $net" >&2
        exit 2
        ;;
    esac
  done
done

# Median over rounds; ratio = pstrain samples/s / the best PyTorch row's.
$PY - "$ROWS" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    net, engine, threads, ms, cpu, sps = line.strip().split("|")
    rows.setdefault((net, engine, threads), []).append((float(ms), float(cpu), float(sps)))
print()
print("| network | engine | threads | ms/step | cpu ms/step | samples/s | vs PyTorch's best |")
print("|---|---|---|---|---|---|---|")
nets = list(dict.fromkeys(k[0] for k in rows))
for net in nets:
    keys = [k for k in rows if k[0] == net]
    med = {k: [statistics.median(v[i] for v in rows[k]) for i in range(3)] for k in keys}
    best = max(med[k][2] for k in keys if k[1].startswith("PyTorch"))
    for k in keys:
        ms, cpu, sps = med[k]
        ratio = "%.2fx" % (sps / best) if k[1].startswith("pstrain") else ""
        print("| %s | %s | %s | %.2f | %.2f | %.1f | %s |" % (net, k[1], k[2], ms, cpu, sps, ratio))
EOF
