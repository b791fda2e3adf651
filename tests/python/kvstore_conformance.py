"""MXNet's dist_sync KVStore conformance check (mxnet_facts.md 1.11), from Python.

Run by every process of a job (tests/cluster/python_test.cc starts it with
`pstrain launch`): the scheduler and the servers run their roles at
`import pstrain`; each worker checks, and exits non-zero (an exception) on a
mismatch. NumPy only.

  --mode sync:  keys start at ones; the `test` optimizer with rate 2; worker r
                pushes (r+1) each round; after round i every worker pulls
                exactly 1 + 2 * W(W+1)/2 * i. Shapes (2,3) and (1200,1200)
                (above the big-array bound: sharded over the servers), int
                keys and (in a second store generation) pushpull; string keys,
                lists of keys, per-device value lists, a key repeated in one
                call, arrays that need a conversion (float64, non-contiguous),
                and errors.
  --mode async: every push applied exactly once (test optimizer, rate 1);
                first, a push the servers refuse (no optimizer yet) is raised
                by the next pull of its key and by barrier.
"""
import argparse
import sys
import time

import numpy as np

import pstrain

SHAPES = [(2, 3), (1200, 1200)]


def check(got, expect, what):
    got = np.asarray(got)
    if not np.all(got == np.float32(expect)):
        bad = np.flatnonzero(got.ravel() != np.float32(expect))[0]
        raise AssertionError("%s: element %d is %r, expected %r"
                             % (what, bad, got.ravel()[bad], expect))


def expect_raises(exc, fn, what):
    try:
        fn()
    except exc as e:
        print("conformance: %s raised %s: %s" % (what, type(e).__name__, e))
        return e
    raise AssertionError("%s did not raise %s" % (what, exc.__name__))


def sync_checks(kv, rounds):
    W, r = kv.num_workers, kv.rank
    rate = 2.0
    kv.set_optimizer(pstrain.optimizer.create("test", rescale_grad=rate))
    keys = [3, 99]
    kv.init(keys, [np.ones(s, np.float32) for s in SHAPES])
    outs = [np.zeros(s, np.float32) for s in SHAPES]
    for i in range(1, rounds + 1):
        push = kv.push(keys, [np.full(s, r + 1, np.float32) for s in SHAPES])
        pull = kv.pull(keys, out=outs)
        push.wait()
        pull.wait()
        for s, o in zip(SHAPES, outs):
            check(o, 1 + rate * W * (W + 1) / 2 * i, "dist_sync round %d shape %s" % (i, s))
    value = float(outs[0][0, 0])

    # pushpull on its own keys: one round trip, the reply is the updated value.
    kv.init(7, np.ones(SHAPES[1], np.float32))
    buf = np.empty(SHAPES[1], np.float32)
    for i in range(1, rounds + 1):
        kv.pushpull(7, np.full(SHAPES[1], r + 1, np.float32), out=buf).wait()
        check(buf, 1 + rate * W * (W + 1) / 2 * i, "pushpull round %d" % i)

    # Conversions: a float64 push and a non-contiguous float64 output.
    kv.init(8, np.ones(SHAPES[0], np.float32))
    kv.push(8, np.full(SHAPES[0], r + 1, np.float64)).wait()
    wide = np.zeros((3, 4), np.float64)[:2, :3]  # a view that is not contiguous
    kv.pull(8, out=wide).wait()
    check(wide, 1 + rate * W * (W + 1) / 2, "float64 push, strided float64 pull")

    # Per-device lists: a push sums them, a pull fills every one.
    kv.init(9, np.ones(SHAPES[0], np.float32))
    kv.push(9, [np.full(SHAPES[0], r + 1, np.float32), np.full(SHAPES[0], 1, np.float32)]).wait()
    devs = [np.zeros(SHAPES[0], np.float32), np.zeros(SHAPES[0], np.float32)]
    kv.pull(9, out=devs).wait()
    for d in devs:
        check(d, 1 + rate * (W * (W + 1) / 2 + W), "per-device lists")

    # A key repeated in one call (MXNet groups them): a push sends the sum (one
    # push per worker in the round), a pull fills each output.
    kv.init(11, np.ones(SHAPES[0], np.float32))
    kv.push([11, 11], [np.full(SHAPES[0], r + 1, np.float32), np.ones(SHAPES[0], np.float32)]).wait()
    twice = [np.zeros(SHAPES[0], np.float32), np.zeros(SHAPES[0], np.float32)]
    kv.pull([11, 11], out=twice).wait()
    for d in twice:
        check(d, 1 + rate * (W * (W + 1) / 2 + W), "a key repeated in one push")
    kv.pushpull([11, 11], [np.ones(SHAPES[0], np.float32)] * 2, out=twice).wait()
    for d in twice:
        check(d, 1 + rate * (W * (W + 1) / 2 + 3 * W), "a key repeated in one pushpull")

    # Non-blocking calls: worker 0's pull waits for worker 1's push (late by 1 s);
    # a wait with a timeout raises past it and leaves the request in flight.
    kv.init(10, np.zeros(SHAPES[0], np.float32))
    if r == 1:
        time.sleep(1.0)
    push = kv.push(10, np.ones(SHAPES[0], np.float32))
    late = np.zeros(SHAPES[0], np.float32)
    pull = kv.pull(10, out=late)
    if r == 0 and W > 1:
        e = expect_raises(pstrain.Error, lambda: pull.wait(timeout=0.2),
                          "a pull waiting for another worker's push, 0.2 s timeout")
        assert "DeadlineExceeded" in str(e), e
        assert not pull.done()
    push.wait()
    pull.wait()
    check(late, rate * W, "the pull waited for again")

    # Errors raised in Python before anything is sent.
    expect_raises(KeyError, lambda: kv.push(1234, np.ones(4, np.float32)), "push of a key never "
                  "initialized")
    expect_raises(ValueError, lambda: kv.push(3, np.ones(5, np.float32)), "push of a wrong size")
    expect_raises(ValueError, lambda: kv.pull(3, out=np.ones(5, np.float32)), "pull of a wrong size")
    # Another shape of the same size (MXNet's shape check; a flat array fits).
    for e in [expect_raises(ValueError, lambda: kv.push(3, np.ones((3, 2), np.float32)),
                            "push of another shape"),
              expect_raises(ValueError, lambda: kv.pull(3, out=np.ones((3, 2), np.float32)),
                            "pull of another shape")]:
        assert "key 3: shape (3, 2), but it was initialized with shape (2, 3)" in str(e), e
    expect_raises(TypeError, lambda: kv.push("x", np.ones(6, np.float32)), "a string key in an "
                  "int-keyed store")
    ro = np.zeros(SHAPES[0], np.float32)
    ro.flags.writeable = False
    expect_raises(ValueError, lambda: kv.pull(3, out=ro), "pull into a read-only array")
    # An error the servers find: the C++ message comes back as pstrain.Error.
    e = expect_raises(pstrain.Error, lambda: kv._client.pull([424242], [6], np.zeros(6, np.float32),
                                                              0).wait(30000),
                      "pull of a key no server holds")
    assert "424242" in str(e), str(e)
    bad = pstrain.optimizer.SGD(learning_rate=0.1)
    bad.momentum = 1.5  # (the constructor refuses it)
    expect_raises(pstrain.Error, lambda: kv.set_optimizer(bad), "momentum 1.5")
    # A request that failed while nobody waited for it (the sweep of answered
    # requests settled it) raises at the next waitall, once.
    lost = np.zeros(6, np.float32)
    kv._issue(kv._client.pull([424242], [6], lost, 0), [lost], [])
    small = np.zeros(SHAPES[0], np.float32)
    for _ in range(1100):
        kv.pull(3, out=small)
    e = expect_raises(pstrain.Error, kv.waitall, "waitall after a pull that failed unseen")
    assert "424242" in str(e), str(e)
    kv.waitall()
    kv.barrier()
    print("conformance: dist_sync ok: %d rounds, %d workers, %d servers, shapes %s, final value %g"
          % (rounds, W, kv.num_servers, SHAPES, value))
    compression_checks(kv, rounds, rate)


def ref_2bit(g, residual, t):
    """MXNet's 2-bit rule in NumPy: what one push carries; moves the residual."""
    residual += g
    q = np.where(residual >= t, np.float32(t),
                 np.where(residual <= -t, np.float32(-t), np.float32(0))).astype(np.float32)
    residual -= q
    return q


def compression_checks(kv, rounds, rate):
    """2-bit compression from every worker: worker k pushes (k + 1) / 4 times a
    ramp over [-2, 2]; the servers (test optimizer, rate `rate`) add what each
    worker's codes carry, which every worker recomputes here. Sharded and
    unsharded keys, push and pushpull; set_optimizer keeps the compression and
    'none' turns it off."""
    W, r, t = kv.num_workers, kv.rank, 0.5
    kv.set_gradient_compression({"type": "2bit", "threshold": t})
    keys = [12, 13]
    kv.init(keys, [np.zeros(s, np.float32) for s in SHAPES])
    ramps = [np.linspace(-2, 2, int(np.prod(s)), dtype=np.float32).reshape(s) for s in SHAPES]
    residuals = [[np.zeros(s, np.float32) for s in SHAPES] for _ in range(W)]
    expect = [np.zeros(s, np.float32) for s in SHAPES]
    outs = [np.zeros(s, np.float32) for s in SHAPES]

    def round_(i, pushpull, rate_now):
        grads = [np.float32((r + 1) / 4) * ramp for ramp in ramps]
        given = [g.copy() for g in grads]
        if pushpull:
            kv.pushpull(keys, grads, out=outs).wait()
        else:
            kv.push(keys, grads).wait()
            kv.pull(keys, out=outs).wait()
        for g, before in zip(grads, given):
            check(g, before, "a compressed push leaves its gradient as it was")
        for j in range(len(SHAPES)):
            carried = sum(ref_2bit(np.float32((k + 1) / 4) * ramps[j], residuals[k][j], t)
                          for k in range(W))
            expect[j] += np.float32(rate_now) * carried
            check(outs[j], expect[j], "2-bit round %d (%s) shape %s"
                  % (i, "pushpull" if pushpull else "push", SHAPES[j]))

    for i in range(1, rounds + 1):
        round_(i, pushpull=(i % 2 == 0), rate_now=rate)
    # A new optimizer keeps the compression.
    kv.set_optimizer(pstrain.optimizer.create("test", rescale_grad=1.0))
    round_(rounds + 1, pushpull=False, rate_now=1.0)
    # Off again: the gradients arrive whole.
    kv.set_gradient_compression({"type": "none"})
    kv.push(keys, [np.float32(r + 1) * ramp for ramp in ramps]).wait()
    kv.pull(keys, out=outs).wait()
    for j in range(len(SHAPES)):
        expect[j] = expect[j] + np.float32(W * (W + 1) / 2) * ramps[j]
        check(outs[j], expect[j], "uncompressed push after compression")
    # On again: the residuals start from zero (what was left unsent is gone).
    kv.set_gradient_compression({"type": "2bit", "threshold": t})
    residuals = [[np.zeros(s, np.float32) for s in SHAPES] for _ in range(W)]
    round_(rounds + 2, pushpull=True, rate_now=1.0)
    expect_raises(ValueError, lambda: kv.set_gradient_compression({"type": "1bit"}),
                  "an unknown compression type")
    e = expect_raises(pstrain.Error, lambda: kv.save_optimizer_states("/nonexistent/states"),
                      "save_optimizer_states in a dist store")
    assert "the servers hold the optimizer's state" in str(e), e
    e = expect_raises(pstrain.Error, lambda: kv._set_updater(lambda k, i, s: None),
                      "_set_updater in a dist store")
    assert "a Python updater runs in local and device stores only" in str(e), e
    kv.barrier()
    print("conformance: 2-bit compression ok: %d rounds, push and pushpull, sharded keys, "
          "off and on again" % (rounds + 2))


def refused_push_checks(kv):
    """Found by review: a dist_async push refused by the servers (no optimizer
    configured yet) went unseen by the pull of its key that followed (it got
    the old value) and by barrier; only waitall or exit raised it."""
    kv.init("early", np.zeros(4, np.float32))
    out = np.full(4, 7, np.float32)
    push = kv.push("early", np.ones(4, np.float32))
    e = expect_raises(pstrain.Error, lambda: kv.pull("early", out=out).wait(),
                      "a pull after a push the servers refused")
    assert "FailedPrecondition" in str(e) and "no optimizer was configured" in str(e), e
    check(out, 0, "the pull after a refused push")  # the pull itself was answered
    expect_raises(pstrain.Error, push.wait, "the refused push's own wait")
    kv.waitall()  # seen: not raised again
    kv.pull("early", out=out).wait()
    refused = kv.push("early", np.ones(4, np.float32))  # refused too, and nobody waits for it
    deadline = time.monotonic() + 30
    while not refused.done():  # barrier raises what was answered by then
        assert time.monotonic() < deadline, "the refused push was not answered in 30 s"
        time.sleep(0.001)
    e = expect_raises(pstrain.Error, kv.barrier, "a barrier after a refused push")
    assert "no optimizer was configured" in str(e), e
    kv.barrier()
    print("conformance: a refused dist_async push raises at the next pull and barrier ok")


def async_checks(kv, rounds):
    W, r = kv.num_workers, kv.rank
    refused_push_checks(kv)
    kv.set_optimizer(pstrain.optimizer.Test(rescale_grad=1.0))
    kv.init(["a", "b"], [np.ones(s, np.float32) for s in SHAPES])
    for _ in range(rounds):
        kv.push(["a", "b"], [np.full(s, r + 1, np.float32) for s in SHAPES]).wait()
    kv.barrier()
    outs = [np.zeros(s, np.float32) for s in SHAPES]
    kv.pull(["a", "b"], out=outs).wait()
    for s, o in zip(SHAPES, outs):
        check(o, 1 + rounds * W * (W + 1) / 2, "dist_async shape %s" % (s,))
    print("conformance: dist_async ok: %d pushes per worker applied exactly once, string keys, "
          "final value %g" % (rounds, outs[0][0, 0]))

    # set_optimizer may come before init: its wd_mult names string keys not
    # initialized yet. SGD, lr 1, wd 0.5: a zero gradient halves a weight per
    # push, except where wd_mult is 0.
    opt = pstrain.optimizer.SGD(learning_rate=1.0, wd=0.5)
    opt.set_wd_mult({"c": 0.0})
    kv.set_optimizer(opt)
    kv.init(["d", "c"], [np.ones(4, np.float32), np.ones(4, np.float32)])
    kv.push(["c", "d"], [np.zeros(4, np.float32), np.zeros(4, np.float32)]).wait()
    kv.barrier()
    c, d = np.zeros(4, np.float32), np.zeros(4, np.float32)
    kv.pull(["c", "d"], out=[c, d]).wait()
    check(c, 1.0, "wd_mult 0 named before init")
    check(d, 0.5 ** W, "wd_mult 1 (default)")
    print("conformance: dist_async wd_mult before init ok")

    # A configuration generation that keeps the optimizer (here: compression
    # off, as set_gradient_compression sends) keeps its schedule's clock: "f",
    # first pushed after 4 rounds of "e" on its server, gets the rate of update 4W + 1 or
    # later (a few hundredths at most), not the first update's 1 (it did before).
    kv.set_optimizer(pstrain.optimizer.SGD(
        learning_rate=1.0, lr_scheduler=pstrain.lr_scheduler.FactorScheduler(step=1, factor=0.5)))
    # The clock is per server: "e" and "f" are two keys apart, so on one
    # server of two (MXNet's placement: key * 9973 % S).
    kv.init(["e", "between", "f"], [np.zeros(4, np.float32)] * 3)
    for _ in range(4):
        kv.push("e", -np.ones(4, np.float32)).wait()
    kv.set_gradient_compression({"type": "none"})
    kv.push("f", -np.ones(4, np.float32)).wait()
    kv.barrier()
    f = np.zeros(4, np.float32)
    kv.pull("f", out=f).wait()
    assert 0 < f[0] < 0.1, "f moved %r: the schedule's clock restarted" % (f[0],)
    print("conformance: a new generation keeps the schedule's clock ok")
    # An allreduce needs rounds: refused here before anything is sent.
    e = expect_raises(pstrain.Error, lambda: kv._allreduce("sum", np.ones(3, np.float32)),
                      "allreduce in dist_async")
    assert "allreduce needs the rounds of dist_sync" in str(e), e
    print("conformance: allreduce refused in dist_async ok")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["sync", "async"], default="sync")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    kv = pstrain.KVStore("dist_sync" if args.mode == "sync" else "dist_async")
    print("conformance: worker rank %d of %d" % (kv.rank, kv.num_workers))
    if args.mode == "sync":
        sync_checks(kv, args.rounds)
    else:
        async_checks(kv, args.rounds)
    kv.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
