"""A dist_sync worker that leaves the job early with sys.exit(3).

tests/cluster/python_cluster_test.cc launches 2 workers: rank 1 exchanges two
rounds and calls sys.exit(3); rank 0 goes on exchanging. The job must fail at
once naming worker 1's exit (not hang until a timeout, rank 0 waiting for the
gradients of a worker that will never push again).

With --clean both workers leave inside ``with kv:`` after two rounds, rank 0
with sys.exit() and rank 1 with sys.exit(0): a normal end, the job succeeds.
"""
import sys
import time

import numpy as np

import pstrain


def clean():
    with pstrain.KVStore("dist_sync") as kv:
        kv.init(0, np.ones(16, np.float32))
        out = np.empty(16, np.float32)
        for _ in range(2):
            kv.pushpull(0, np.ones(16, np.float32), out=out).wait()
        print("early_exit: rank %d leaving inside `with kv:`" % kv.rank, flush=True)
        if kv.rank == 0:
            sys.exit()
        sys.exit(0)


def main():
    if "--clean" in sys.argv:
        return clean()
    kv = pstrain.KVStore("dist_sync")
    kv.set_optimizer(pstrain.optimizer.SGD(learning_rate=0.01))
    keys = list(range(4))
    kv.init(keys, [np.ones(256, np.float32) for _ in keys])
    grads = [np.full(256, 0.001, np.float32) for _ in keys]
    outs = [np.empty(256, np.float32) for _ in keys]
    for _ in range(2):
        kv.pushpull(keys, grads, out=outs).wait()
    if kv.rank == 1:
        print("early_exit: leaving with sys.exit(3)", flush=True)
        sys.exit(3)
    deadline = time.time() + 120
    while time.time() < deadline:
        kv.pushpull(keys, grads, out=outs).wait()
    print("early_exit: no error within 120 s", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
