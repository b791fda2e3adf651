"""The JPEG twins of the exact CIFAR-10 images we have.

  python3 bench/cifar_twins.py PARTIAL_DIR WORK [SPLIT ...]

PARTIAL_DIR is ../shared/data/cifar10_partial (every label of each batch, the
first images of each); WORK holds the JPEG set unpacked (train/ and test/ from
cifar10-jpeg.tar.gz). The JPEG set names an image <split>/<class>/NNNN.jpg,
NNNN counting the images of its class in the order of the official batches,
so each exact image has its twin there. Writes WORK/jpeg_<split>.lst (an
im2rec list, the exact images' order) for each SPLIT (train and test unless
given) and prints how many twins each has.
"""
import os
import sys

BATCHES = {"train": ["data_batch_%d" % i for i in range(1, 6)], "test": ["test_batch"]}


def twins(src, work, classes, split):
    seen = [0] * 10
    lines = []
    for b in BATCHES[split]:
        labels = open(os.path.join(src, b + ".labels"), "rb").read()
        cut = [f for f in os.listdir(src) if f.startswith(b + ".") and f.endswith(".bin")]
        have = os.path.getsize(os.path.join(src, cut[0])) // 3073 if cut else 0
        for i, c in enumerate(labels):
            if i < have:
                path = "%s/%s/%04d.jpg" % (split, classes[c], seen[c])
                if not os.path.exists(os.path.join(work, path)):
                    sys.exit("cifar_twins.py: missing " + os.path.join(work, path))
                lines.append("%d\t%d\t%s\n" % (len(lines), c, path))
            seen[c] += 1
    with open(os.path.join(work, "jpeg_%s.lst" % split), "w") as f:
        f.writelines(lines)
    return len(lines)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    src, work = sys.argv[1], sys.argv[2]
    splits = sys.argv[3:] or ["train", "test"]
    for split in splits:
        if split not in BATCHES:
            sys.exit("cifar_twins.py: unknown split %r (train or test)" % split)
    classes = [l.strip() for l in open(os.path.join(src, "classes.txt")) if l.strip()]
    if len(classes) != 10:
        sys.exit("cifar_twins.py: %s lists %d classes, not 10" % (
            os.path.join(src, "classes.txt"), len(classes)))
    print("twins: " + ", ".join("%d %s" % (twins(src, work, classes, s), s) for s in splits))


if __name__ == "__main__":
    main()
