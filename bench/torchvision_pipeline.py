#!/usr/bin/env python3
"""torchvision's decode + RandomResizedCrop pipeline on the JPEGs of a RecordIO
file, on one core, for comparison with `pstrain imageio` (image_pipeline_bench.sh).

Reads the .rec with a minimal RecordIO parser (whole records only, which is
what im2rec writes for JPEG payloads), then per image: PIL decode, RGB,
RandomResizedCrop(size), RandomHorizontalFlip, ToTensor, Normalize, and
collates batches like a DataLoader would. Prints one line: images/s.
Run with /usr/bin/python3 (the interpreter with torch and torchvision).
"""
import argparse
import io
import struct
import time

import torch
from PIL import Image
from torchvision import transforms

MAGIC = 0xCED7230A


def read_jpegs(path, limit):
    out = []
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos + 8 <= len(data) and len(out) < limit:
        magic, lrec = struct.unpack_from("<II", data, pos)
        assert magic == MAGIC, "bad magic at %d" % pos
        cflag, length = lrec >> 29, lrec & ((1 << 29) - 1)
        assert cflag == 0, "multi-piece record at %d" % pos
        payload = data[pos + 8:pos + 8 + length]
        flag = struct.unpack_from("<I", payload, 0)[0]
        out.append(payload[24 + 4 * flag:])
        pos += 8 + ((length + 3) & ~3)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rec")
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--passes", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    jpegs = read_jpegs(args.rec, args.images)
    tf = transforms.Compose([
        transforms.RandomResizedCrop(args.size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    best = 0.0
    for _ in range(args.passes):
        start = time.perf_counter()
        batch = []
        for jpeg in jpegs:
            img = Image.open(io.BytesIO(jpeg)).convert("RGB")
            batch.append(tf(img))
            if len(batch) == args.batch_size:
                torch.stack(batch)
                batch = []
        if batch:
            torch.stack(batch)
        best = max(best, len(jpegs) / (time.perf_counter() - start))
    print("torchvision images=%d size=%d images_per_s=%.0f" % (len(jpegs), args.size, best))


if __name__ == "__main__":
    main()
