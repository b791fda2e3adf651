"""Closing a dist store while another thread's calls are in flight (1 worker).

tests/cluster/python_cluster_test.cc starts the job by hand (no launcher to
stop this process when the job fails). The worker's second thread pushes a
large key in a loop; the main thread fails the store meanwhile: the loop must
end with pstrain.Error ("closed") in its thread, without a crash (the client
and the node were destroyed under a push in flight), and exit 0.
"""
import sys
import threading
import time

import numpy as np

import pstrain

N = 1 << 22  # 16 MiB: each push spends a while in the client, the GIL released


def main():
    kv = pstrain.KVStore("dist_async")
    kv.init(7, np.zeros(N, np.float32))
    grad = np.ones(N, np.float32)
    result = []
    started = threading.Event()

    def pushes():
        n = 0
        try:
            while True:
                kv._client.push([7], [N], grad, 0)
                n += 1
                started.set()
        except pstrain.Error as e:
            result.append("raised pstrain.Error after %s pushes: %s" % ("some" if n else "no", e))
        started.set()
    t = threading.Thread(target=pushes)
    t.start()
    started.wait(30)
    time.sleep(0.2)
    print("close_race: closing while pushes are in flight", flush=True)
    kv._fail("close_race: closed while another thread pushes")
    t.join(30)
    print("close_race: the pushing thread %s" % (result,), flush=True)
    return 0 if result and "closed" in result[0] else 1


if __name__ == "__main__":
    sys.exit(main())
