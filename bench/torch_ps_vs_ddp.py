#!/usr/bin/python3
"""One worker of bench/torch_ps_vs_ddp.sh: PyTorch training steps through
pstrain's DistributedOptimizer or DistributedDataParallel, or their parts.

  --mode ps        DistributedOptimizer, server-side SGD (under `pstrain launch`)
  --mode ddp       DistributedDataParallel over gloo (RANK, WORLD_SIZE, MASTER_ADDR,
                   MASTER_PORT from the driver), torch.optim.SGD
  --mode local     the same step without any communication (the driver runs as
                   many at once as the others have workers, so the cores are
                   shared alike): the compute time of a step
  --mode comm-ps   only the exchange of a step: pushpull of every parameter, in
                   backward's order with its priority, then wait for all
  --mode comm-ddp  only the exchange of a step: all-reduce of every gradient

SGD: lr 0.05, momentum 0.9, wd 1e-4 everywhere. MNIST images from --data-dir
in random batches of --batch-size per worker. Prints on rank 0:
  bench: mode=... network=... workers=W servers=S batch=B steps=N step_ms=...
         samples_per_s=... (the job's: all workers) comm_ms=... wait_ms=...
comm_ms: per step, the time some exchange was in flight (ps: from the
DistributedOptimizer's hooks to the servers' answers; ddp: each bucket's
all-reduce, timed by a comm hook that does what DDP's default one does);
wait_ms: per step, the part of it training waited for (ps: the optimizer's
waits before a layer's forward; ddp: backward's wait after its last launch).
"""
import os

if "DMLC_ROLE" in os.environ:
    import pstrain  # the scheduler and the servers stop here

import argparse  # noqa: E402
import gzip  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import build  # noqa: E402

LR, MOM, WD = 0.05, 0.9, 1e-4


def mnist_images(data_dir, count):
    path = os.path.join(data_dir, "train-images-idx3-ubyte.gz")
    with gzip.open(path, "rb") as f:
        data = f.read(16 + count * 784)
    x = np.frombuffer(data, np.uint8, count * 784, 16).reshape(count, 1, 28, 28)
    return torch.from_numpy(x.astype(np.float32) / 256)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", required=True,
                    choices=["ps", "ddp", "local", "comm-ps", "comm-ddp"])
    ap.add_argument("--network", default="lenet")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--data-dir", default="../shared/data/mnist")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = build(args.network)
    x = mnist_images(args.data_dir, 10000)
    y = torch.randint(0, 10, (len(x),))
    rank, workers, servers = 0, 1, 0
    kv = dist = opt = None
    launches, intervals = [], []  # DDP: all-reduce launch times, (launch, answer)
    exposed = [0.0]  # DDP: backward's wait after its last launch
    if args.mode in ("ps", "comm-ps"):
        import pstrain.torch
        kv = pstrain.KVStore("dist_sync")
        rank, workers, servers = kv.rank, kv.num_workers, kv.num_servers
        sgd = pstrain.optimizer.SGD(learning_rate=LR, momentum=MOM, wd=WD)
        if args.mode == "ps":
            opt = pstrain.torch.DistributedOptimizer(sgd, model)
        else:
            named = list(model.named_parameters())
            kv.init([n for n, _ in named], [p for _, p in named])
            kv.set_optimizer(sgd)
            grads = [torch.full(p.shape, 1e-6) for _, p in named]
        barrier = kv.barrier
    elif args.mode in ("ddp", "comm-ddp"):
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank, workers = dist.get_rank(), dist.get_world_size()
        if args.mode == "ddp":
            model = torch.nn.parallel.DistributedDataParallel(model)
            # DDP's default hook (average by all-reduce), timed: each bucket's
            # all-reduce from launch to answer.
            def timed_allreduce(state, bucket):
                t0 = time.perf_counter()
                launches.append(t0)
                fut = dist.all_reduce(bucket.buffer().div_(workers), async_op=True).get_future()

                def done(f):
                    intervals.append((t0, time.perf_counter()))
                    return f.value()[0]
                return fut.then(done)
            model.register_comm_hook(None, timed_allreduce)
        flat = torch.zeros(sum(p.numel() for p in model.parameters()))
        barrier = dist.barrier
    else:
        barrier = lambda: None  # noqa: E731
    if opt is None:
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOM, weight_decay=WD)

    def step(b):
        if args.mode == "comm-ps":
            hs = [kv.pushpull(n, g, out=p, priority=-i) for i, ((n, p), g)
                  in reversed(list(enumerate(zip(named, grads))))]
            for h in hs:
                h.wait()
            return
        if args.mode == "comm-ddp":
            dist.all_reduce(flat)
            flat.div_(workers)
            return
        idx = torch.randint(0, len(x), (args.batch_size,))
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        if launches:
            exposed[0] += max(0.0, time.perf_counter() - launches[-1])
        opt.step()

    for b in range(args.warmup):
        step(b)
    if args.mode == "ps":
        opt.synchronize()
    barrier()
    wait0 = getattr(opt, "wait_seconds", 0.0)
    comm0 = getattr(opt, "comm_seconds", 0.0)
    exposed[0] = 0.0
    del intervals[:]
    start = time.perf_counter()
    for b in range(args.steps):
        step(b)
    if args.mode == "ps":
        opt.synchronize()
    elapsed = time.perf_counter() - start
    barrier()
    if args.mode == "ps":
        wait = opt.wait_seconds - wait0
        comm = opt.comm_seconds - comm0
    else:
        wait = exposed[0]
        comm, end = 0.0, float("-inf")
        for a, b in sorted(intervals):
            if b > end:
                comm += b - max(a, end)
                end = b
    if rank == 0:
        print("bench: mode=%s network=%s workers=%d servers=%d batch=%d steps=%d step_ms=%.3f "
              "samples_per_s=%.1f comm_ms=%.3f wait_ms=%.3f" % (
                  args.mode, args.network, workers, servers, args.batch_size, args.steps,
                  1000 * elapsed / args.steps, workers * args.steps * args.batch_size / elapsed,
                  1000 * comm / args.steps, 1000 * wait / args.steps), flush=True)
    if dist is not None:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
