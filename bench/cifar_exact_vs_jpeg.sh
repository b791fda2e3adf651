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
# and the accuracy of each epoch is printed side by side. With TORCH=python3
# (a Python with torch and PIL, e.g. Debian's) PyTorch trains the same network
# on the same files with the same settings (bench/torch_cifar_rec.py) for the
# first two, as a check of pstrain's training itself (TORCH_DEVICE=cuda on a
# GPU, beside `--gpus 0` for pstrain).
#   [TORCH=python3] bash bench/cifar_exact_vs_jpeg.sh [pstrain] [epochs] [extra train flags...]
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

python3 "$(dirname "$0")/cifar_twins.py" "$DATA/cifar10_partial" "$work" ||
  die "listing the JPEG twins"
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

# shellcheck disable=SC2054  # the commas are in values (3,28,28)
common=(--network inception-bn-28-small --image-shape 3,28,28 --num-classes 10 --random-crop 1
  --random-mirror 1 --wd 0.00001 --initializer "uniform(0.07)" --batch-size 128 --lr 0.1
  --kv-store local --num-epochs "$EPOCHS" --disp-batches 1000 "$@")
rec() { [[ $1 == exact ]] && echo "$work/exact/$2.rec" || echo "$work/jpeg_$2.rec"; }
runs=(pstrain:exact:exact pstrain:jpeg:jpeg pstrain:jpeg:exact)
[[ -n ${TORCH:-} ]] && runs+=(torch:exact:exact torch:jpeg:jpeg)
echo
for run in "${runs[@]}"; do
  IFS=: read -r who tr va <<<"$run"
  log="$work/$who-$tr-$va.log"
  start=$(date +%s)
  if [[ $who == pstrain ]]; then
    "$P" train "${common[@]}" --data-train "$(rec "$tr" train)" --data-val "$(rec "$va" test)" \
      --mean-img "$work/$tr-mean.bin" >"$log" 2>&1
  else
    "$TORCH" "$(dirname "$0")/torch_cifar_rec.py" "$(rec "$tr" train)" "$(rec "$va" test)" \
      "$EPOCHS" "$(nproc)" "${TORCH_DEVICE:-cpu}" >"$log" 2>&1
  fi || { tail -5 "$log" >&2; die "training $run failed"; }
  echo "$who $tr->$va: $(($(date +%s) - start)) s"
  for what in Train Validation; do
    grep -o "Epoch\[[0-9]*\] $what-accuracy=[0-9.]*" "$log" | sed 's/.*=//' >"$log.$what"
  done
done
echo
printf '| epoch |'
for run in "${runs[@]}"; do
  IFS=: read -r who tr va <<<"$run"
  printf ' %s %s->%s train | valid |' "$who" "$tr" "$va"
done
printf '\n|---:|%s\n' "$(printf -- '---:|---:|%.0s' "${runs[@]}")"
cols=()
for run in "${runs[@]}"; do
  IFS=: read -r who tr va <<<"$run"
  cols+=("$work/$who-$tr-$va.log.Train" "$work/$who-$tr-$va.log.Validation")
done
paste "${cols[@]}" | awk '{ printf "| %d |", NR; for (i = 1; i <= NF; ++i) printf " %.3f |", $i; print "" }'
echo
echo "mean validation accuracy of the last 5 epochs:"
for run in "${runs[@]}"; do
  IFS=: read -r who tr va <<<"$run"
  tail -5 "$work/$who-$tr-$va.log.Validation" |
    awk -v r="$who $tr->$va" '{ s += $1; n++ } END { printf "  %-22s %.4f\n", r, s / n }'
done
