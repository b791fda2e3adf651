#!/usr/bin/env bash
# Image pipeline throughput (see bench/RESULTS.md, "Image pipeline"):
#  1. CIFAR-10 JPEGs (../shared/data/cifar10_jpeg) packed by `pstrain im2rec`,
#     read by `pstrain imageio` (ImageRecordIter: 32x32 -> random crop 28,
#     mirror, mean/std), 1 and 2 decode threads;
#  2. 224x224 JPEGs (CIFAR test images resized by im2rec --resize 224), one
#     decode thread, RandomResizedCrop(224, area 0.08-1, aspect 3/4-4/3) +
#     mirror, side by side with torchvision's PIL decode + RandomResizedCrop
#     on one core (bench/torchvision_pipeline.py, /usr/bin/python3).
# Prints a markdown table. Usage: bash bench/image_pipeline_bench.sh [N224]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${PSTRAIN_BIN:-build/pstrain}
DATA=${PSTRAIN_SHARED_DATA_DIR:-../shared/data}
N224=${1:-2000}
EPOCHS=${PSTRAIN_BENCH_EPOCHS:-3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/pstrain_imgbench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

tar -xzf "$DATA/cifar10_jpeg/cifar10-jpeg.tar.gz" -C "$WORK"
"$BIN" im2rec --list --recursive "$WORK/cifar_train" "$WORK/train" >/dev/null
pack=$("$BIN" im2rec --num-thread 2 "$WORK/cifar_train" "$WORK/train")
pack_rate=$(sed -n 's/.*(\([0-9]*\) images\/s).*/\1/p' <<<"$pack")

# Best images/s over the passes of one `pstrain imageio` run.
best() { awk '$1 ~ /^[0-9]+$/ && NF == 5 { if ($5 > m) m = $5 } END { print m }'; }

cifar() {
  "$BIN" imageio --data-train "$WORK/cifar_train.rec" --data-train-idx "$WORK/cifar_train.idx" \
    --random-crop 1 --random-mirror 1 --io-image-shape 3,28,28 --io-batch-size 128 \
    --rgb-mean 125.307,122.961,113.8575 --rgb-std 51.5865,50.847,51.255 \
    --data-nthreads "$1" --io-epochs "$EPOCHS" | best
}
c1=$(cifar 1)
c2=$(cifar 2)

"$BIN" im2rec --list --recursive --noshuffle "$WORK/all_test" "$WORK/test" >/dev/null
awk 'NR % 5 == 0' "$WORK/all_test.lst" | head -n "$N224" >"$WORK/big224.lst"
"$BIN" im2rec --resize 224 --num-thread 2 "$WORK/big224" "$WORK/test" >/dev/null
ours=$("$BIN" imageio --data-train "$WORK/big224.rec" --random-resized-crop 1 \
  --min-random-area 0.08 --min-random-aspect-ratio 0.75 --max-random-aspect-ratio 1.3333 \
  --random-mirror 1 --io-image-shape 3,224,224 --io-batch-size 64 --data-nthreads 1 \
  --rgb-mean 123.68,116.779,103.939 --rgb-std 58.393,57.12,57.375 --io-epochs "$EPOCHS" | best)
tv=$(/usr/bin/python3 bench/torchvision_pipeline.py "$WORK/big224.rec" --images "$N224" \
  --passes "$EPOCHS" | sed -n 's/.*images_per_s=\([0-9]*\).*/\1/p')

echo "| workload | pipeline | threads | images/s |"
echo "|---|---|---:|---:|"
echo "| CIFAR-10 JPEG -> .rec (im2rec, q95) | pstrain im2rec | 2 | $pack_rate |"
echo "| CIFAR-10 .rec, 32x32 -> crop 28 + mirror + mean/std | pstrain imageio | 1 | $c1 |"
echo "| CIFAR-10 .rec, 32x32 -> crop 28 + mirror + mean/std | pstrain imageio | 2 | $c2 |"
echo "| $N224 JPEGs 224x224, RandomResizedCrop 224 + mirror | pstrain imageio | 1 | $ours |"
echo "| $N224 JPEGs 224x224, RandomResizedCrop 224 + mirror | torchvision (PIL) | 1 | $tv |"
awk -v a="$ours" -v b="$tv" 'BEGIN { printf "| 224x224 per-core ratio pstrain / torchvision | | | %.2fx |\n", a / b }'
