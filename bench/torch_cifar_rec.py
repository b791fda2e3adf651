"""PyTorch's side of bench/cifar_exact_vs_jpeg.sh: inception-bn-28-small
(bench/torch_models.py) trained on the same RecordIO files as `pstrain train`,
with the same settings as the seed's incept_3 (MXNet 2015): SGD lr 0.1,
momentum 0.9, weight decay 0.00001 on every parameter, Uniform(0.07) weights,
zero biases, batch 128, 28x28 random crops and mirrors of the 32x32 images,
the mean image of the training images' centre crops subtracted, centre crops
scored. Prints MXNet's log lines, so `pstrain parse-log` reads them:

  python3 bench/torch_cifar_rec.py TRAIN.rec VAL.rec EPOCHS [THREADS [DEVICE [EXAMPLES [NAME=REC ...]]]]

DEVICE is "cpu" (default) or "cuda" (cuDNN benchmark mode on). EXAMPLES per
epoch (default: one pass over TRAIN.rec): as `pstrain train --num-examples`,
each epoch starts a new shuffled pass and runs on into the next one when
EXAMPLES is more than a pass (the seed's epochs were 60,000 images).
Each NAME=REC is a further validation set, scored at each epoch's end like
VAL.rec and logged as "Validation-NAME-accuracy" (`pstrain parse-log
--metric-names accuracy,NAME-accuracy` tabulates it). Images are decoded with
PIL, or torchvision where PIL is missing.
"""
import io
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn

import torch_models

try:
    from PIL import Image

    def decode(body):
        return np.asarray(Image.open(io.BytesIO(body)).convert("RGB"))
except ImportError:
    try:
        import torchvision.io

        def decode(body):
            raw = torch.frombuffer(bytearray(body), dtype=torch.uint8)
            img = torchvision.io.decode_image(raw, mode=torchvision.io.ImageReadMode.RGB)
            return img.permute(1, 2, 0).numpy()
    except ImportError:
        sys.exit("torch_cifar_rec.py: decoding the images needs PIL (pip install pillow) "
                 "or torchvision")

MAGIC = 0xCED7230A


def read_rec(path):
    """(images uint8 N x 32 x 32 x 3, labels int64 N) of an im2rec file."""
    data = open(path, "rb").read()
    images, labels, at, payload = [], [], 0, b""
    while at + 8 <= len(data):
        magic, lrec = struct.unpack_from("<II", data, at)
        if magic != MAGIC:
            sys.exit("%s: bad RecordIO magic at byte %d" % (path, at))
        cflag, length = lrec >> 29, lrec & ((1 << 29) - 1)
        payload += data[at + 8:at + 8 + length]
        at += 8 + (length + 3) // 4 * 4
        if cflag in (1, 2):  # a record split around a magic word: the word is data
            payload += struct.pack("<I", MAGIC)
            continue
        flag, label, _, _ = struct.unpack_from("<IfQQ", payload, 0)
        body = payload[24:]
        if flag > 0:  # a list of labels: the first one
            label = struct.unpack_from("<f", body, 0)[0]
            body = body[4 * flag:]
        images.append(decode(body))
        labels.append(int(label))
        payload = b""
    return np.stack(images), np.array(labels, dtype=np.int64)


def main():
    train_rec, val_rec, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(int(sys.argv[4]) if len(sys.argv) > 4 else 2)
    dev = torch.device(sys.argv[5] if len(sys.argv) > 5 else "cpu")
    examples = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    extra = []
    for arg in sys.argv[7:]:
        name, sep, path = arg.partition("=")
        if not sep or not name or not path:
            sys.exit("torch_cifar_rec.py: %r: a further validation set is NAME=REC" % arg)
        extra.append((name, path))
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    x_train, y_train = read_rec(train_rec)
    # NCHW float; the mean image of the training set's centre crops.
    to_t = lambda x: torch.from_numpy(x.transpose(0, 3, 1, 2).astype(np.float32)).to(dev)
    x_train, y_train = to_t(x_train), torch.from_numpy(y_train).to(dev)
    mean = x_train[:, :, 2:30, 2:30].mean(0, keepdim=True)
    # Every validation set: centre crops less that mean.
    val_sets = []
    for name, path in [("", val_rec)] + extra:
        x, y = read_rec(path)
        val_sets.append((name, to_t(x)[:, :, 2:30, 2:30] - mean, torch.from_numpy(y).to(dev)))

    model = torch_models.build("inception-bn-28-small", (3, 28, 28), 10).to(dev)
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.uniform_(m.weight, -0.07, 0.07)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.00001)
    loss_fn = nn.CrossEntropyLoss()
    batch, n = 128, len(y_train)
    batches = (examples if examples > 0 else n) // batch
    for epoch in range(epochs):
        model.train()
        start, right, seen = time.time(), 0, 0
        # A new pass at each epoch's start, and more passes while it lasts.
        passes = -(-batches * batch // n)
        order = torch.from_numpy(
            np.concatenate([rng.permutation(n) for _ in range(passes)])).to(dev)
        for b in range(batches):
            idx = order[b * batch:(b + 1) * batch]
            offsets = rng.integers(0, 5, size=(batch, 2))
            x = torch.stack([x_train[i, :, oy:oy + 28, ox:ox + 28]
                             for i, (oy, ox) in zip(idx.tolist(), offsets)])
            flip = torch.from_numpy(rng.random(batch) < 0.5).to(dev)
            x = torch.where(flip[:, None, None, None], x.flip(3), x) - mean
            out = model(x)
            loss = loss_fn(out, y_train[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            right += (out.argmax(1) == y_train[idx]).sum().item()
            seen += batch
        print("INFO:root:Epoch[%d] Train-accuracy=%f" % (epoch, right / seen))
        print("INFO:root:Epoch[%d] Time cost=%.3f" % (epoch, time.time() - start))
        model.eval()
        for name, x_val, y_val in val_sets:
            with torch.no_grad():
                pred = torch.cat([model(x_val[i:i + 500]).argmax(1)
                                  for i in range(0, len(y_val), 500)])
            print("INFO:root:Epoch[%d] Validation-%saccuracy=%f"
                  % (epoch, name + "-" if name else "", (pred == y_val).float().mean()), flush=True)


if __name__ == "__main__":
    main()
