#!/usr/bin/python3
"""Trains a PyTorch LeNet (or MLP) on MNIST across pstrain's parameter servers.

    PYTHONPATH=build/python build/pstrain launch -n 2 -s 1 --launcher local -- \
        python3 examples/torch_mnist.py
    build/pstrain parse-log logs/<job-id>

MNIST comes from --data-dir, else from the first folder that holds it, as
for `pstrain train --dataset mnist`: $PSTRAIN_MNIST_DIR, $PSTRAIN_DATA/mnist,
datasets/mnist, ../shared/data/mnist (from the current folder, then from
this repository's root); `build/pstrain data get mnist` fetches it.

Every process runs this script: `import pstrain` turns the scheduler and the
servers into their roles; the workers train. Each worker reads part `rank` of
`num_workers` of the training set (equal batches per worker, so dist_sync
never waits at an epoch's end), and prints MXNet's log lines, which
`pstrain parse-log` (and MXNet's parse_log.py) read. Without DMLC_ROLE (plain
`python3 examples/torch_mnist.py`) it trains alone with the PyTorch optimizer,
for comparison; the lines marked "pstrain" are all that differ: distributed,
`pstrain.torch.server_optimizer` turns that same optimizer (--optimizer sgd,
nag, adam, rmsprop, adagrad; --no-bias-decay: a parameter group without
weight decay for the biases) into the servers' optimizer.
"""
import os

DISTRIBUTED = "DMLC_ROLE" in os.environ
if DISTRIBUTED:
    import pstrain  # pstrain: the scheduler and the servers stop here

import argparse  # noqa: E402  (the servers need none of what follows)
import gzip  # noqa: E402
import logging  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

if DISTRIBUTED:
    import pstrain.torch  # noqa: E402  pstrain


def read_idx(path):
    """An MNIST idx file (.gz or raw) as a uint8 array."""
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path += ".gz"
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    count = int.from_bytes(data[4:8], "big")
    if magic == 2051:
        rows, cols = int.from_bytes(data[8:12], "big"), int.from_bytes(data[12:16], "big")
        need = 16 + count * rows * cols
        shape, offset = (count, 1, rows, cols), 16
    elif magic == 2049:
        need, shape, offset = 8 + count, (count,), 8
    else:
        raise ValueError("%s: magic %d is not an MNIST idx file" % (path, magic))
    if len(data) < need:
        raise ValueError("%s: %d bytes, the header promises %d" % (path, len(data), need))
    return np.frombuffer(data, np.uint8, need - offset, offset).reshape(shape)


MNIST_FILES = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
               "t10k-labels-idx1-ubyte"]


def holds_mnist(folder):
    return all(os.path.exists(os.path.join(folder, f)) or
               os.path.exists(os.path.join(folder, f + ".gz")) for f in MNIST_FILES)


def find_mnist(data_dir=None, env=None):
    """The folder to read MNIST from: data_dir, else the first that holds it."""
    if data_dir:
        return data_dir
    env = os.environ if env is None else env
    if env.get("PSTRAIN_MNIST_DIR"):
        folder = env["PSTRAIN_MNIST_DIR"]
        if not holds_mnist(folder):
            raise FileNotFoundError("PSTRAIN_MNIST_DIR=%s does not hold MNIST (%s, or .gz)"
                                    % (folder, ", ".join(MNIST_FILES)))
        return folder
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    tried = []
    for base in (".", root):
        for folder in ([os.path.join(env["PSTRAIN_DATA"], "mnist")] if env.get("PSTRAIN_DATA")
                       else []) + [os.path.join(base, "datasets", "mnist"),
                                   os.path.join(base, "..", "shared", "data", "mnist")]:
            folder = os.path.normpath(folder)
            if folder not in tried:
                if holds_mnist(folder):
                    return folder
                tried.append(folder)
    raise FileNotFoundError("no folder holds MNIST (looked in %s): `build/pstrain data get "
                            "mnist` fetches it into datasets/mnist, or pass --data-dir"
                            % ", ".join(tried))


def load(data_dir, prefix):
    x = read_idx(os.path.join(data_dir, prefix + "-images-idx3-ubyte"))
    y = read_idx(os.path.join(data_dir, prefix + "-labels-idx1-ubyte"))
    return torch.from_numpy(x.astype(np.float32) / 256), torch.from_numpy(y.astype(np.int64))


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 20, 5)
        self.conv2 = nn.Conv2d(20, 50, 5)
        self.fc1 = nn.Linear(800, 500)
        self.fc2 = nn.Linear(500, 10)

    def forward(self, x):
        x = F.max_pool2d(torch.tanh(self.conv1(x)), 2)
        x = F.max_pool2d(torch.tanh(self.conv2(x)), 2)
        return self.fc2(torch.tanh(self.fc1(x.flatten(1))))


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 64),
                         nn.ReLU(), nn.Linear(64, 10))


def accuracy(model, x, y, batch=1000):
    model.eval()
    with torch.no_grad():
        right = sum(int((model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum())
                    for i in range(0, len(x), batch))
    model.train()
    return right / len(x)


def torch_optimizer(args, model):
    """The torch.optim optimizer --optimizer names, over model's parameters."""
    params = model.parameters()
    wd = 0.0 if args.optimizer == "adagrad" else args.wd
    if args.no_bias_decay:
        named = list(model.named_parameters())
        params = [{"params": [p for n, p in named if not n.endswith("bias")]},
                  {"params": [p for n, p in named if n.endswith("bias")], "weight_decay": 0.0}]
    o = torch.optim
    if args.optimizer in ("sgd", "nag"):
        return o.SGD(params, lr=args.lr, momentum=args.mom, weight_decay=wd,
                     nesterov=args.optimizer == "nag")
    if args.optimizer == "adam":
        return o.Adam(params, lr=args.lr, weight_decay=wd)
    if args.optimizer == "rmsprop":
        return o.RMSprop(params, lr=args.lr, weight_decay=wd)
    return o.Adagrad(params, lr=args.lr)  # (its weight decay has no server-side twin)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", help="MNIST's folder (default: the first that holds it, "
                    "$PSTRAIN_MNIST_DIR, $PSTRAIN_DATA/mnist, datasets/mnist, "
                    "../shared/data/mnist)")
    ap.add_argument("--network", choices=["lenet", "mlp"], default="lenet")
    ap.add_argument("--kv-store", default="dist_sync", help="dist_sync or dist_async")
    ap.add_argument("--num-epochs", type=int, default=2)
    ap.add_argument("--num-examples", type=int, default=60000, help="training examples used")
    ap.add_argument("--batch-size", type=int, default=64, help="per worker")
    ap.add_argument("--optimizer", choices=["sgd", "nag", "adam", "rmsprop", "adagrad"],
                    default="sgd", help="torch.optim's SGD (nag: nesterov), Adam, RMSprop, "
                    "Adagrad; distributed, the servers run it")
    ap.add_argument("--lr", type=float, default=0.05, help="(adam, rmsprop: try 0.001)")
    ap.add_argument("--mom", type=float, default=0.9, help="sgd and nag")
    ap.add_argument("--wd", type=float, default=1e-4, help="weight decay (not adagrad)")
    ap.add_argument("--no-bias-decay", action="store_true",
                    help="no weight decay for the biases (a parameter group of their own)")
    ap.add_argument("--disp-batches", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.optimizer == "nag" and args.mom == 0:
        ap.error("--optimizer nag needs --mom > 0 (Nesterov momentum)")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:%(name)s:%(message)s")
    torch.manual_seed(args.seed)

    rank, workers = 0, 1
    if DISTRIBUTED:
        kv = pstrain.KVStore(args.kv_store)  # pstrain
        rank, workers = kv.rank, kv.num_workers  # pstrain
    data_dir = find_mnist(args.data_dir)
    x, y = load(data_dir, "train")
    vx, vy = load(data_dir, "t10k")
    n = min(args.num_examples, len(x)) // workers
    x, y = x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]  # this worker's part
    model = LeNet() if args.network == "lenet" else mlp()
    opt = torch_optimizer(args, model)
    if DISTRIBUTED:
        # pstrain: the same optimizer on the servers; the gradient of each layer leaves
        # as soon as backward produced it, its new weights are waited for before its
        # next forward.
        opt = pstrain.torch.DistributedOptimizer(  # pstrain
            pstrain.torch.server_optimizer(opt, model), model)  # pstrain
    batches = n // args.batch_size
    logging.info("rank %d of %d: %s, %s, %d batches of %d per epoch, %s", rank, workers,
                 args.network, args.optimizer, batches, args.batch_size,
                 args.kv_store if DISTRIBUTED else "local")
    for epoch in range(args.num_epochs):
        start = tick = time.time()
        right = seen = 0
        perm = torch.randperm(n)
        for b in range(batches):
            idx = perm[b * args.batch_size:(b + 1) * args.batch_size]
            out = model(x[idx])
            loss = F.cross_entropy(out, y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            right += int((out.argmax(1) == y[idx]).sum())
            seen += len(idx)
            if (b + 1) % args.disp_batches == 0:
                now = time.time()
                logging.info("Epoch[%d] Batch [%d]\tSpeed: %.2f samples/sec\taccuracy=%f", epoch,
                             b + 1, args.disp_batches * args.batch_size / (now - tick),
                             right / seen)
                tick = now
        if DISTRIBUTED:
            opt.synchronize()  # pstrain: the last exchanges land before the weights are read
        logging.info("Epoch[%d] Train-accuracy=%f", epoch, right / max(1, seen))
        logging.info("Epoch[%d] Time cost=%.3f", epoch, time.time() - start)
        logging.info("Epoch[%d] Validation-accuracy=%f", epoch, accuracy(model, vx, vy))


if __name__ == "__main__":
    main()
