#!/usr/bin/env bash
# How much of CIFAR-10's accuracy does the JPEG copy (quality about 75) cost?
# The seed's record files were made from the original images; the only
# complete CIFAR-10 here is ../shared/data/cifar10_jpeg. The exact images we
# have (../shared/data/cifar10_partial: 8,068 training images, the first 1,017
# test images) are trained on twice, side by side, with the seed's incept_3
# settings (inception-bn-28-small, batch 128, lr 0.1, wd 0.00001,
# Uniform(0.07), 28x28 random crops and mirrors, mean image):
#   exact->exact  the exact images, packed losslessly (`pstrain rec cifar10`)
#   jpeg->jpeg    the JPEG files of the same images, packed by `pstrain im2rec`
#                 (re-encoded at quality 95, as bench/gpu_seed001.sh does)
#   jpeg->exact   trained on the JPEG files, scored on the exact test images
# and the validation accuracy of each epoch is printed side by side.
#   bash bench/cifar_exact_vs_jpeg.sh [pstrain] [epochs] [extra train flags...]
#   e.g. bash bench/cifar_exact_vs_jpeg.sh build/pstrain 15
#        bash bench/cifar_exact_vs_jpeg.sh build/pstrain 40 --gpus 0
set -uo pipefail
P=$(realpath "${1:-build/pstrain}")
EPOCHS=${2:-15}
shift $(($# < 2 ? $# : 2))
DATA=$(realpath "${PSTRAIN_SHARED_DATA_DIR:-$(dirname "$0")/../../shared/data}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
die() { echo "cifar_exact_vs_jpeg: $*" >&2; exit 1; }

"$P" rec cifar10 "$DATA/cifar10_partial" "$work/exact" >/dev/null || die "packing the exact images"
tar -xzf "$DATA/cifar10_jpeg/cifar10-jpeg.tar.gz" -C "$work" || die "unpacking the JPEG set"

# The JPEG set names an image <split>/<class>/NNNN.jpg, NNNN counting the
# images of its class in the order of the official batches; the labels of
# every batch are known, so each exact image has its JPEG twin.
python3 - "$DATA/cifar10_partial" "$work" <<'EOF' || die "listing the JPEG twins"
import os, re, sys
src, work = sys.argv[1], sys.argv[2]
classes = [l.strip() for l in open(os.path.join(src, "classes.txt")) if l.strip()]
assert len(classes) == 10, classes
def twins(split, batches):
    seen = [0] * 10
    lines = []
    for b in batches:
        labels = open(os.path.join(src, b + ".labels"), "rb").read()
        cut = [f for f in os.listdir(src) if f.startswith(b + ".") and f.endswith(".bin")]
        have = os.path.getsize(os.path.join(src, cut[0])) // 3073 if cut else 0
        for i, c in enumerate(labels):
            if i < have:
                path = "%s/%s/%04d.jpg" % (split, classes[c], seen[c])
                if not os.path.exists(os.path.join(work, path)):
                    sys.exit("missing " + path)
                lines.append("%d\t%d\t%s\n" % (len(lines), c, path))
            seen[c] += 1
    with open(os.path.join(work, "jpeg_%s.lst" % split), "w") as f:
        f.writelines(lines)
    return len(lines)
n_train = twins("train", ["data_batch_%d" % i for i in range(1, 6)])
n_test = twins("test", ["test_batch"])
print("twins: %d training, %d test images" % (n_train, n_test))
EOF
for split in train test; do
  "$P" im2rec --num-thread "$(nproc)" "$work/jpeg_$split" "$work" >/dev/null ||
    die "packing the JPEG $split images"
done

# The twins must be the same pictures: per-record channel means within a few
# levels (JPEG noise), where a wrong pairing differs by tens.
for split in train test; do
  "$P" rec ls "$work/exact/$split.rec" | awk -F'\t' '!/^#/ {print $7}' >"$work/m_exact"
  "$P" rec ls "$work/jpeg_$split.rec" | awk -F'\t' '!/^#/ {print $7}' >"$work/m_jpeg"
  paste -d, "$work/m_exact" "$work/m_jpeg" | awk -F, -v s="$split" '
    { for (c = 1; c <= 3; ++c) { d = $c - $(c + 3); sum += d < 0 ? -d : d } n += 3 }
    END { printf "twins (%s): mean |channel mean difference| %.2f levels over %d records\n", s, sum / n, n / 3
          if (n == 0 || sum / n > 3) exit 1 }' || die "the $split twins do not match"
done

common=(--network inception-bn-28-small --image-shape 3,28,28 --num-classes 10 --random-crop 1
  --random-mirror 1 --wd 0.00001 --initializer "uniform(0.07)" --batch-size 128 --lr 0.1
  --kv-store local --num-epochs "$EPOCHS" --disp-batches 1000 "$@")
train_exact=(--data-train "$work/exact/train.rec" --mean-img "$work/exact/mean.bin")
train_jpeg=(--data-train "$work/jpeg_train.rec" --mean-img "$work/jpeg_mean.bin")
echo
for run in exact:exact jpeg:jpeg jpeg:exact; do
  tr=${run%%:*} va=${run##*:}
  if [[ $tr == exact ]]; then t=("${train_exact[@]}"); else t=("${train_jpeg[@]}"); fi
  if [[ $va == exact ]]; then v="$work/exact/test.rec"; else v="$work/jpeg_test.rec"; fi
  start=$(date +%s)
  "$P" train "${common[@]}" "${t[@]}" --data-val "$v" >"$work/$tr-$va.log" 2>&1 ||
    { tail -5 "$work/$tr-$va.log" >&2; die "training $run failed"; }
  echo "$tr->$va: $(($(date +%s) - start)) s"
  grep -o "Epoch\[[0-9]*\] Validation-accuracy=[0-9.]*" "$work/$tr-$va.log" |
    sed 's/.*=//' >"$work/$tr-$va.val"
  grep -o "Epoch\[[0-9]*\] Train-accuracy=[0-9.]*" "$work/$tr-$va.log" |
    sed 's/.*=//' >"$work/$tr-$va.train"
done
echo
echo "| epoch | exact->exact train | valid | jpeg->jpeg train | valid | jpeg->exact valid |"
echo "|---:|---:|---:|---:|---:|---:|"
paste "$work/exact-exact.train" "$work/exact-exact.val" "$work/jpeg-jpeg.train" \
  "$work/jpeg-jpeg.val" "$work/jpeg-exact.val" |
  awk '{ printf "| %d | %.3f | %.3f | %.3f | %.3f | %.3f |\n", NR, $1, $2, $3, $4, $5 }'
echo
echo "mean of the last 5 epochs' validation accuracy:"
for r in exact-exact jpeg-jpeg jpeg-exact; do
  tail -5 "$work/$r.val" | awk -v r="$r" '{ s += $1; n++ } END { printf "  %s %.4f\n", r, s / n }'
done
