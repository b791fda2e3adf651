#!/usr/bin/env python3
"""PyTorch's counterpart of `pstrain train --gpus 0,0,...` on one device:
DistributedDataParallel over gloo with N processes that all use the same
device, each on its share of one batch (the batch split as pstrain splits
it), SGD with momentum. N = 1 is the plain single-process step. Prints

  ddp-split: network=... batch=B processes=N samples_per_s=... step_ms=...

(the median step of rank 0 after the warm-up; samples/s of the whole batch).
gloo, because NCCL refuses two ranks on one GPU.

  python3 bench/torch_ddp_split_step.py --network resnet --batch 128 --processes 2 \\
      --image-shape 3,224,224 --num-classes 1000 [--device cuda] [--steps 20]
"""
import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models  # noqa: E402


def shares(batch, n):
    """pstrain's SplitBatch with equal weights (MXNet's _split_input_slice):
    round(batch / n) each (halves to even), a shortfall to the last, then
    consecutive slices cut at the batch's end; an empty one is an error."""
    s = [int(round(batch / n))] * n
    s[-1] += max(0, batch - sum(s))
    out, start = [], 0
    for x in s:
        end = min(start + x, batch)
        out.append(end - start)
        start = end
    if min(out) <= 0:
        raise SystemExit("a batch of %d over %d processes leaves one without an example"
                         % (batch, n))
    return out


def worker(rank, a, port, out):
    n = a.processes
    if n > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=n)
    torch.manual_seed(1)
    dev = torch.device(a.device)
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = True
    shape = tuple(int(v) for v in a.image_shape.split(","))
    model = torch_models.build(a.network, shape, a.num_classes, a.num_layers).to(dev).train()
    if n > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    mine = shares(a.batch, n)[rank]
    x = torch.rand(mine, *shape, device=dev)
    y = (torch.arange(mine) % a.num_classes).to(dev)

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(a.warmup):
        step()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    if n > 1:
        dist.barrier()
    if rank == 0:
        times.sort()
        out.put(times[len(times) // 2])
    if n > 1:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--network", default="lenet")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--image-shape", default="1,28,28")
    ap.add_argument("--num-classes", type=int, default=10)
    ap.add_argument("--num-layers", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    if a.processes < 1 or a.batch < a.processes:
        raise SystemExit("--processes must be in [1, --batch]")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    procs = [ctx.Process(target=worker, args=(r, a, port, out)) for r in range(a.processes)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
        if p.exitcode != 0:
            raise SystemExit("a DDP process failed (exit code %s)" % p.exitcode)
    step_s = out.get()
    print("ddp-split: network=%s batch=%d processes=%d samples_per_s=%.1f step_ms=%.2f" %
          (a.network, a.batch, a.processes, a.batch / step_s, 1e3 * step_s))


if __name__ == "__main__":
    main()
