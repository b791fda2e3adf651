#!/usr/bin/env python3
"""PyTorch counterpart of nn_step_bench: one SGD training step of the same
network on synthetic data, on the CPU. Prints the same table row.

  /usr/bin/python3 bench/torch_step_bench.py [--network lenet|mlp] [--batch 128]
      [--steps 50] [--threads 2]
"""
import argparse
import time

import torch
import torch.nn as nn


def build(name):
    if name == "lenet":
        return nn.Sequential(
            nn.Conv2d(1, 20, 5), nn.Tanh(), nn.MaxPool2d(2, 2),
            nn.Conv2d(20, 50, 5), nn.Tanh(), nn.MaxPool2d(2, 2),
            nn.Flatten(), nn.Linear(800, 500), nn.Tanh(), nn.Linear(500, 10))
    if name == "mlp":
        return nn.Sequential(
            nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
            nn.Linear(64, 10))
    raise SystemExit("unknown network " + name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--network", default="lenet")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.manual_seed(1)
    torch.set_num_threads(a.threads)
    model = build(a.network)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    x = torch.rand(a.batch, 1, 28, 28)
    y = torch.arange(a.batch) % 10

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    t0 = time.perf_counter()
    c0 = time.process_time()
    for _ in range(a.steps):
        step()
    s = time.perf_counter() - t0
    cpu = time.process_time() - c0
    print("| %s | %d | pytorch %s | %d | %.2f | %.2f | %.1f |"
          % (a.network, a.batch, torch.__version__, a.threads, 1e3 * s / a.steps,
             1e3 * cpu / a.steps, a.batch * a.steps / s))


if __name__ == "__main__":
    main()
