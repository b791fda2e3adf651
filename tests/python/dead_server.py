"""A worker that exchanges values until a server dies, then shows what it raised.

tests/cluster/python_test.cc starts a job by hand (2 servers, 2 workers, every
process this script), waits for "dead_server: exchanging", kills server 1 and
expects every worker to print "dead_server: raised" with the C++ message and
exit non-zero within the heartbeat timeout. Exiting by the exception is the
point: the store then reports the failure, and nothing hangs.
"""
import sys
import time

import numpy as np

import pstrain


def main():
    kv = pstrain.KVStore("dist_sync")
    kv.set_optimizer(pstrain.optimizer.SGD(learning_rate=0.01))
    keys = list(range(8))
    kv.init(keys, [np.ones(1024, np.float32) for _ in keys])
    grads = [np.full(1024, 0.001, np.float32) for _ in keys]
    outs = [np.empty(1024, np.float32) for _ in keys]
    print("dead_server: exchanging", flush=True)
    last_ok = time.time()
    deadline = last_ok + 120
    try:
        while time.time() < deadline:
            kv.pushpull(keys, grads, out=outs).wait()
            last_ok = time.time()
    except pstrain.Error as e:
        print("dead_server: raised %.1f s after the last answer: %s" % (time.time() - last_ok, e),
              flush=True)
        raise
    print("dead_server: no error within 120 s", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
