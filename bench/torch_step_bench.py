#!/usr/bin/env python3
"""PyTorch counterpart of nn_step_bench: one SGD training step of the same
network (bench/torch_models.py) on synthetic data, on the CPU or a GPU
(eager mode, cuDNN benchmark mode on). Prints the same table row as
nn_step_bench, and on a GPU the peak memory PyTorch allocated.

  python3 bench/torch_step_bench.py [--network lenet] [--batch 128] [--steps 50]
      [--threads 2] [--device cpu|cuda] [--image-shape 1,28,28] [--num-classes 10]
      [--num-layers 0] [--channels-last] [--check-params N] [--profile N]

--profile N: after the timed steps, N more steps under torch.profiler, and
the operators' and the kernels' self time per step (device time on a GPU),
to set beside nn_step_bench --profile's layers.
"""
import argparse
import os
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--network", default="lenet")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--image-shape", default="1,28,28")
    ap.add_argument("--num-classes", type=int, default=10)
    ap.add_argument("--num-layers", type=int, default=0)
    ap.add_argument("--channels-last", action="store_true",
                    help="keep activations and weights in channels_last (NHWC) memory format")
    ap.add_argument("--check-params", type=int, default=-1,
                    help="exit 1 unless the model has this many parameters")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="profile N more steps: time per operator and per kernel")
    a = ap.parse_args()
    torch.manual_seed(1)
    torch.set_num_threads(a.threads)
    shape = tuple(int(v) for v in a.image_shape.split(","))
    model = torch_models.build(a.network, shape, a.num_classes, a.num_layers)
    n = torch_models.num_params(model)
    if a.check_params >= 0 and n != a.check_params:
        print("%s: %d parameters, pstrain has %d" % (a.network, n, a.check_params))
        return 1
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.backends.cudnn.benchmark = True
    model = model.to(dev).train()
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    x = torch.rand(a.batch, *shape, device=dev)
    if len(shape) == 3:
        x = x.contiguous(memory_format=fmt)
    y = (torch.arange(a.batch) % a.num_classes).to(dev)

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    # The median step, as nn_step_bench reports: a shared machine's stalls land
    # in a few steps and would move the mean by tens of percent.
    times = []
    c0 = time.process_time()
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    cpu = time.process_time() - c0
    s = sorted(times)[len(times) // 2] * a.steps
    print("| %s | %d | pytorch %s%s%s | %d | %.2f | %.2f | %.1f |"
          % (a.network, a.batch, torch.__version__, " cuda" if cuda else "",
             " channels_last" if a.channels_last else "", a.threads,
             1e3 * s / a.steps, 1e3 * cpu / a.steps, a.batch * a.steps / s))
    if cuda:
        print("peak memory allocated by PyTorch: %.2f MB (reserved %.2f MB)"
              % (torch.cuda.max_memory_allocated() / 1e6, torch.cuda.max_memory_reserved() / 1e6))
    if a.profile > 0:
        profile(step, a.profile, cuda)
    return 0


def profile(step, steps, cuda):
    """Self time per operator and, on a GPU, per kernel, in ms per step."""
    from torch.profiler import ProfilerActivity
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    events = prof.key_averages()

    def self_time(e):  # microseconds; PyTorch 2.4 renamed cuda to device
        if not cuda:
            return e.self_cpu_time_total
        return getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)

    rows = sorted((e for e in events if self_time(e) > 0), key=self_time, reverse=True)
    ops = [e for e in rows if e.key.startswith("aten::") or e.key.startswith("cudnn")]
    total = sum(self_time(e) for e in rows if not e.key.startswith("aten::"))
    what = "device" if cuda else "CPU"
    print("\n| operator | calls per step | self %s ms per step |\n|---|---:|---:|" % what)
    for e in ops[:25]:
        print("| %s | %.1f | %.3f |" % (e.key, e.count / steps, self_time(e) / 1e3 / steps))
    if cuda:
        # Kernels (and copies) are the events that are not aten operators.
        print("\n| kernel | launches per step | ms per step |\n|---|---:|---:|")
        for e in [e for e in rows if not e.key.startswith("aten::")][:30]:
            print("| %s | %.1f | %.3f |" % (e.key[:110], e.count / steps,
                                            self_time(e) / 1e3 / steps))
        print("\nkernels and copies: %.2f ms of device time per step" % (total / 1e3 / steps))


if __name__ == "__main__":
    sys.exit(main())
