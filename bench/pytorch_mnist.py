#!/usr/bin/python3
"""PyTorch 1.13 CPU baseline for bench/train_vs_pytorch.sh.

Trains MXNet's mlp or lenet (same layers, same init rule, SGD momentum 0.9,
wd 1e-4, lr 0.1, batch 128) on the MNIST idx files for a number of examples
and prints one line: `samples/sec=<training throughput> val_accuracy=<acc>`.
Pixels are scaled by 1/256 as our reader (MXNet's MNISTIter) does.
"""
import argparse
import gzip
import os
import time

import numpy as np
import torch
import torch.nn as nn


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    count = int.from_bytes(data[4:8], "big")
    if magic == 2051:
        rows = int.from_bytes(data[8:12], "big")
        cols = int.from_bytes(data[12:16], "big")
        return np.frombuffer(data, np.uint8, count * rows * cols, 16).reshape(count, 1, rows, cols)
    return np.frombuffer(data, np.uint8, count, 8)


def find(d, name):
    p = os.path.join(d, name)
    return p if os.path.exists(p) else p + ".gz"


def model(name):
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 64),
                             nn.ReLU(), nn.Linear(64, 10))
    return nn.Sequential(nn.Conv2d(1, 20, 5), nn.Tanh(), nn.MaxPool2d(2, 2),
                         nn.Conv2d(20, 50, 5), nn.Tanh(), nn.MaxPool2d(2, 2), nn.Flatten(),
                         nn.Linear(800, 500), nn.Tanh(), nn.Linear(500, 10))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--network", default="lenet")
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--num-examples", type=int, default=60000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--nesterov", type=int, default=0, help="1: Nesterov momentum (MXNet's nag)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x = torch.from_numpy(read_idx(find(args.data_dir, "train-images-idx3-ubyte")).astype(np.float32) / 256)
    y = torch.from_numpy(read_idx(find(args.data_dir, "train-labels-idx1-ubyte")).astype(np.int64))
    vx = torch.from_numpy(read_idx(find(args.data_dir, "t10k-images-idx3-ubyte")).astype(np.float32) / 256)
    vy = torch.from_numpy(read_idx(find(args.data_dir, "t10k-labels-idx1-ubyte")).astype(np.int64))
    net = model(args.network)
    for m in net.modules():  # fit.py's default: Xavier(gaussian, in, 2); biases 0
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            fan_in = m.weight[0].numel()
            nn.init.normal_(m.weight, 0.0, (2.0 / fan_in) ** 0.5)
            nn.init.zeros_(m.bias)
    decay = [p for n, p in net.named_parameters() if n.endswith("weight")]
    no_decay = [p for n, p in net.named_parameters() if not n.endswith("weight")]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 1e-4},
                           {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, momentum=0.9,
                          nesterov=bool(args.nesterov))
    loss_fn = nn.CrossEntropyLoss()
    bs = args.batch_size
    batches = (args.num_examples + bs - 1) // bs
    perm = torch.randperm(x.shape[0])
    net.train()
    start = time.time()
    for b in range(batches):
        idx = perm[(torch.arange(bs) + b * bs) % x.shape[0]]
        opt.zero_grad()
        loss = loss_fn(net(x[idx]), y[idx])
        loss.backward()
        opt.step()
    secs = time.time() - start
    net.eval()
    with torch.no_grad():
        correct = sum((net(vx[i:i + 1000]).argmax(1) == vy[i:i + 1000]).sum().item()
                      for i in range(0, vx.shape[0], 1000))
    print("samples/sec=%.2f val_accuracy=%.4f" % (batches * bs / secs, correct / vx.shape[0]))


if __name__ == "__main__":
    main()
