"""The pstrain package without a cluster: import, roles, the local store, errors.

Run by tests/unit/python_package_test.cc with the build's module on
PYTHONPATH; exits non-zero (an exception) on any failure. NumPy; the PyTorch
cases run when torch imports.
"""
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np

import pstrain


def run_python(code, **env):
    """Runs `code` in a fresh interpreter with `env` added; (exit code, output)."""
    full = dict(os.environ)
    for k in ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER",
              "DMLC_NUM_WORKER"):
        full.pop(k, None)
    full.update(env)
    p = subprocess.run([sys.executable, "-c", code], env=full, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=60)
    return p.returncode, p.stdout.decode(errors="replace")


class FakeCompletion:
    """A request's end that the test controls (the C++ Completion's interface)."""

    def __init__(self, error=None, done=True):
        self.error = error
        self.event = threading.Event()
        if done:
            self.event.set()

    def done(self):
        return self.event.is_set()

    def done_at(self):
        return time.perf_counter() if self.done() else float("nan")

    def wait(self, ms):
        if not self.event.wait(ms / 1000.0):
            raise pstrain.Error("DeadlineExceeded: fake request not done")
        if self.error is not None:
            raise self.error


def store_with_fake_requests():
    """A local store whose handles come from FakeCompletions (as a dist store's would)."""
    kv = pstrain.KVStore("local")
    kv._timeout_ms = 5000
    return kv


def expect_error(fn, exc, *words):
    try:
        fn()
    except exc as e:
        for w in words:
            assert w in str(e), (w, str(e))
        return e
    raise AssertionError("%s did not raise %s" % (fn, exc.__name__))


def test_lost_errors():
    """A request that failed while nobody waited for it (settled by the sweep of
    answered requests) raises at the next waitall, barrier or close, once."""
    for end in ("waitall", "barrier", "close"):
        kv = store_with_fake_requests()
        kv._issue(FakeCompletion(pstrain.Error("Unavailable: server 1 died")), [], [])
        for _ in range(1100):  # past 1024 pending: the answered ones are swept
            kv._issue(FakeCompletion(), [], [])
        assert len(kv._pending) < 1024, len(kv._pending)
        expect_error(getattr(kv, end), pstrain.Error, "server 1 died")
        if end != "close":
            getattr(kv, end)()  # raised once: the store goes on
    # An error its own wait() raised is not raised again.
    kv = store_with_fake_requests()
    h = kv._issue(FakeCompletion(pstrain.Error("Unavailable: server 2 died")), [], [])
    expect_error(h.wait, pstrain.Error, "server 2 died")
    kv.waitall()
    kv.close()
    print("package: lost errors ok")


def test_pull_after_failed_push():
    """Found by review: a pull of a key did not report the failure of this
    worker's earlier push of it. A pull answered before the push waits for
    the push's answer; its error is raised once (by the pull, not again by
    waitall)."""
    kv = store_with_fake_requests()
    push_end = FakeCompletion(done=False)
    push = kv._issue(push_end, [], [])
    kv._note_push(3, push)
    pull = kv._issue(FakeCompletion(), [], [], kv._pushes_before(3))
    other = kv._issue(FakeCompletion(), [], [], kv._pushes_before(4))  # another key
    assert not pull.done() and other.done()

    def refuse():
        push_end.error = pstrain.Error("FailedPrecondition: async push of key 3 refused")
        push_end.event.set()
    timer = threading.Timer(0.1, refuse)
    timer.start()
    expect_error(pull.wait, pstrain.Error, "async push of key 3 refused")
    timer.join()
    other.wait()
    expect_error(pull.wait, pstrain.Error, "async push of key 3 refused")  # every wait
    kv.waitall()  # seen by the pull's wait
    assert kv._pushes_before(3) == [], "a failure seen still orders later pulls"
    kv._issue(FakeCompletion(), [], [], kv._pushes_before(3)).wait()
    # A push that succeeds: the pull after it reports nothing.
    ok = kv._issue(FakeCompletion(), [], [])
    kv._note_push(3, ok)
    kv._issue(FakeCompletion(), [], [], kv._pushes_before(3)).wait()
    # barrier raises the first failure answered by then, and waits for no
    # request in flight (a dist_sync push's answer may wait for a worker that
    # pushes only after the barrier: waiting for it there would deadlock).
    late = FakeCompletion(done=False)
    kv._issue(late, [], [])
    kv.barrier()  # in flight: passed
    late.error = pstrain.Error("Unavailable: server 1 died")
    late.event.set()
    expect_error(kv.barrier, pstrain.Error, "server 1 died")
    kv.barrier()
    # A pull of two keys whose earlier pushes both failed raises the first and
    # leaves the second for waitall (it was taken as seen and lost).
    for key, word in ((5, "push of key 5 refused"), (6, "push of key 6 refused")):
        kv._note_push(key, kv._issue(FakeCompletion(error=pstrain.Error(word)), [], []))
    both = kv._combine([kv._issue(FakeCompletion(), [], [], kv._pushes_before(k)) for k in (5, 6)])
    expect_error(both.wait, pstrain.Error, "push of key 5 refused")
    expect_error(kv.waitall, pstrain.Error, "push of key 6 refused")
    kv.waitall()
    print("package: pull after a failed push ok")


def test_repeated_keys():
    """MXNet sums the values one push gives a key more than once, and a pull
    fills every output given for a key."""
    kv = pstrain.KVStore("local")
    kv.init([3, 4], [np.zeros(2, np.float32), np.zeros(2, np.float32)])
    kv.push([3, 3, 4], [np.full(2, 1, np.float32), [np.full(2, 2, np.float32),
                                                    np.full(2, 4, np.float32)],
                        np.full(2, 5, np.float32)]).wait()
    a, b, c = (np.zeros(2, np.float32) for _ in range(3))
    kv.pull([3, 4, 3], out=[a, c, b]).wait()
    assert a.tolist() == [7, 7] and b.tolist() == [7, 7] and c.tolist() == [5, 5], (a, b, c)
    # With an optimizer the sum is one update (momentum tells one from two).
    kv.set_optimizer(pstrain.optimizer.SGD(learning_rate=1.0, momentum=0.9))
    g1, g2 = np.full(2, 1, np.float32), np.full(2, 2, np.float32)
    kv.push([3, 3], [g1, g2]).wait()
    kv.pull(3, out=a).wait()
    assert a.tolist() == [4, 4], a
    # pushpull: one update of the sum, every output gets the result.
    kv.pushpull([4, 4], [g1, g2], out=[b, c]).wait()
    assert b.tolist() == [2, 2] and c.tolist() == [2, 2], (b, c)
    print("package: repeated keys ok")


def test_output_sizes():
    """Every output of a pull or pushpull is checked before anything is sent."""
    kv = pstrain.KVStore("local")
    kv.init("p", np.zeros(4, np.float32))
    ok, short = np.zeros(4, np.float32), np.zeros(3, np.float32)
    expect_error(lambda: kv.pushpull("p", np.ones(4, np.float32), out=[ok, short]), ValueError,
                 "'p'", "output 2 has 3 elements, the value 4")
    expect_error(lambda: kv.pull("p", out=[ok, short]), ValueError,
                 "'p'", "output 2 has 3 elements, the key 4")
    kv.pull("p", out=ok).wait()
    assert ok.tolist() == [0, 0, 0, 0], ok  # the refused pushpull pushed nothing
    print("package: output sizes ok")


def test_shapes():
    """Found by review: a push of (3, 2) into a key initialized as (2, 3) was
    taken (same size); MXNet refuses another shape. A flat array of as many
    elements still fits, and nothing refused changes the key."""
    kv = pstrain.KVStore("local")
    kv.init(3, np.arange(6, dtype=np.float32).reshape(2, 3))
    words = ("key 3", "shape (3, 2)", "initialized with shape (2, 3)")
    other = np.ones((3, 2), np.float32)
    expect_error(lambda: kv.push(3, other), ValueError, "push of", *words)
    expect_error(lambda: kv.push(3, [np.ones((2, 3), np.float32), other]), ValueError, *words)
    expect_error(lambda: kv.pull(3, out=other), ValueError, "pull of", *words)
    expect_error(lambda: kv.pull(3, out=[np.zeros((2, 3), np.float32), other]), ValueError,
                 *words)
    expect_error(lambda: kv.pushpull(3, np.ones((2, 3), np.float32), out=other), ValueError,
                 *words)
    expect_error(lambda: kv.pushpull(3, other, out=np.zeros((2, 3), np.float32)), ValueError,
                 *words)
    flat = np.zeros(6, np.float32)
    kv.pull(3, out=flat).wait()
    assert flat.tolist() == [0, 1, 2, 3, 4, 5], flat  # nothing refused was stored
    # Flat arrays of the key's size fit, as before.
    kv.push(3, np.full(6, 2, np.float32)).wait()
    kv.pushpull(3, np.full(6, 3, np.float64), out=flat).wait()
    assert flat.tolist() == [3] * 6, flat
    # A key initialized flat keeps its shape too.
    kv.init(4, np.zeros(6, np.float32))
    expect_error(lambda: kv.push(4, np.ones((2, 3), np.float32)), ValueError,
                 "key 4", "shape (2, 3)", "initialized with shape (6,)")
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        t = torch.zeros(2, 3)
        kv.pushpull(3, torch.ones(2, 3), out=t).wait()
        assert t.tolist() == [[1, 1, 1]] * 2, t
        expect_error(lambda: kv.pull(3, out=torch.zeros(3, 2)), ValueError, *words)
    print("package: shapes ok")


def test_settle():
    """A copy into the caller's array that fails is the request's error (raised
    by every wait, the copy run once); handles waited for from several threads
    settle once; an error closing a store at exit ends the process with 1 and
    a one-line message."""
    kv = store_with_fake_requests()
    calls = []

    def failing_copy():
        calls.append(1)
        raise RuntimeError("copy into the caller's tensor failed")
    h = kv._issue(FakeCompletion(), [], [failing_copy])
    for _ in range(2):
        expect_error(h.wait, RuntimeError, "copy into the caller's tensor failed")
    assert len(calls) == 1 and not kv._pending, (calls, kv._pending)
    kv.waitall()  # its wait raised it

    # Four threads wait for one request (and a group holding it) as it ends.
    for group in (False, True):
        kv = store_with_fake_requests()
        c = FakeCompletion(done=False)
        copies, errors = [], []

        def slow_copy():
            copies.append(1)
            time.sleep(0.05)
        h = kv._issue(c, [], [slow_copy])
        waited = kv._combine([h, kv._issue(FakeCompletion(), [], [])]) if group else h

        def waiter():
            try:
                waited.wait()
            except BaseException as e:
                errors.append(e)
        threads = [threading.Thread(target=waiter) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.05)
        c.event.set()
        for t in threads:
            t.join(10)
        assert not errors and len(copies) == 1 and waited.done() and not kv._pending, \
            (group, errors, copies)

    code, out = run_python(
        "import pstrain, pstrain.kvstore\n"
        "kv = pstrain.KVStore('local')\n"
        "def close():\n"
        "    raise ValueError('the copy into a freed tensor failed')\n"
        "kv.close = close\n"
        "pstrain.kvstore._OPEN.append(kv)\n"
        "print('script done')\n")
    assert code == 1 and "script done" in out and "Traceback" not in out \
        and "pstrain: closing the KVStore at exit failed: ValueError: the copy into a freed " \
        "tensor failed" in out, (code, out)
    print("package: settling ok")


def test_keys_and_timeouts():
    """Found by review: int keys past the wire's range were taken (a dist store
    failed later, and only on rank 0), 3.7 was key 3 and True key 1; and a
    wait(timeout=t) on a request of N keys could take N x t."""
    kv = pstrain.KVStore("local")
    expect_error(lambda: kv.init(2 ** 33, np.ones(2, np.float32)), ValueError,
                 "key 8589934592: int keys are in [0, %d]" % pstrain._pstrain.MAX_KEY)
    expect_error(lambda: kv.init(-1, np.ones(2, np.float32)), ValueError, "int keys are in")
    expect_error(lambda: kv.init(3.7, np.ones(2, np.float32)), TypeError,
                 "key 3.7: a key is an int or a str, not a float")
    expect_error(lambda: kv.init(True, np.ones(2, np.float32)), TypeError, "not a bool")
    kv.init(np.int64(5), np.ones(2, np.float32))
    kv.init(pstrain._pstrain.MAX_KEY, np.ones(2, np.float32))
    out = np.zeros(2, np.float32)
    kv.pull(5, out=out).wait()
    assert np.all(out == 1), out
    # A refused key does not fix the store's kind of keys.
    s = pstrain.KVStore("local")
    expect_error(lambda: s.init(1.5, np.ones(1, np.float32)), TypeError, "not a float")
    s.init("w", np.ones(1, np.float32))

    # One timeout for the whole wait: five requests answered 0.15 s apart,
    # each within 0.2 s of the one before (each key's wait had the whole
    # timeout, so the old wait returned ok after 0.75 s).
    for grouped in (True, False):
        kv = store_with_fake_requests()
        comps = [FakeCompletion(done=False) for _ in range(5)]
        if grouped:
            waited = kv._combine([kv._issue(c, [], []) for c in comps])
        else:
            waited = pstrain.kvstore.Handle(kv, comps, [], [])
        timers = [threading.Timer(0.15 * (k + 1), c.event.set) for k, c in enumerate(comps)]
        start = time.monotonic()
        for t in timers:
            t.start()
        expect_error(lambda: waited.wait(timeout=0.2), pstrain.Error, "DeadlineExceeded")
        took = time.monotonic() - start
        assert took < 0.5, (grouped, took)
        for t in timers:
            t.join(5)
        waited.wait()  # all answered now: waited for as usual
        kv.waitall()
    print("package: keys and timeouts ok")


def test_init_values():
    """A list of numbers is one array (a list of arrays: one per device, the
    first one counts, as in MXNet); an empty value is refused naming its key."""
    kv = pstrain.KVStore("local")
    kv.init(5, [1.0, 2.0, 3.0])
    kv.init(6, ([1, 2], [3, 4]))
    kv.init(7, [np.full(2, 7, np.float32), np.full(2, 8, np.float32)])
    a, b, c = np.zeros(3, np.float32), np.zeros((2, 2), np.float32), np.zeros(2, np.float32)
    kv.pull([5, 6, 7], out=[a, b, c]).wait()
    assert a.tolist() == [1, 2, 3] and b.tolist() == [[1, 2], [3, 4]] and c.tolist() == [7, 7], \
        (a, b, c)
    kv.push(5, [0.5, 0.5, 0.5]).wait()
    kv.pull(5, out=a).wait()
    assert a.tolist() == [0.5, 0.5, 0.5], a
    for empty in (np.zeros(0, np.float32), [], np.zeros((3, 0), np.float32)):
        expect_error(lambda: kv.init(8, empty), ValueError, "key 8", "empty")
    kv.init(8, np.ones(1, np.float32))  # the refused init left no trace
    print("package: init values ok")


def test_mnist_example_finds_data():
    """examples/torch_mnist.py looks for MNIST where `pstrain train` does."""
    try:
        import torch  # noqa: F401  (the example needs it)
    except ImportError:
        print("package: torch not installed: the MNIST example's search skipped")
        return
    import importlib.util
    import tempfile
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(
        "torch_mnist", os.path.join(here, "..", "..", "examples", "torch_mnist.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        def fake_mnist(folder):
            os.makedirs(folder)
            for f in example.MNIST_FILES:
                open(os.path.join(folder, f + ".gz"), "wb").close()
            return folder
        by_var = fake_mnist(os.path.join(tmp, "by_var"))
        by_root = fake_mnist(os.path.join(tmp, "root", "mnist"))
        os.chdir(tmp)
        try:
            assert example.find_mnist("given", {}) == "given"
            assert example.find_mnist(None, {"PSTRAIN_MNIST_DIR": by_var}) == by_var
            expect_error(lambda: example.find_mnist(None, {"PSTRAIN_MNIST_DIR": tmp}),
                         FileNotFoundError, "PSTRAIN_MNIST_DIR=" + tmp)
            assert example.find_mnist(None, {"PSTRAIN_DATA": os.path.dirname(by_root)}) == by_root
            local = fake_mnist(os.path.join(tmp, "datasets", "mnist"))
            assert os.path.samefile(example.find_mnist(None, {}), local)
        finally:
            os.chdir(cwd)
    print("package: mnist example finds its data ok")


def test_store_lifecycle():
    """A dist store whose first configuration fails is closed as failed (not
    left open, so a new store can be made); in an interactive session an
    error the prompt printed does not make the exit a failure."""
    code, out = run_python(
        "import pstrain, pstrain.kvstore as k\n"
        "class FakeClient:\n"
        "    request_timeout_ms = 1000\n"
        "    def configure(self, *args):\n"
        "        raise pstrain.Error('Unavailable: server 0 did not answer')\n"
        "    def close(self, why=''):\n"
        "        print('client closed: %r' % why)\n"
        "k._pstrain.Client = FakeClient\n"
        "for attempt in range(2):\n"
        "    try:\n"
        "        pstrain.KVStore('dist_sync')\n"
        "    except pstrain.Error as e:\n"
        "        print('attempt %d raised: %s' % (attempt, e))\n"
        "print('open stores:', [s for s in k._OPEN if not s._closed])\n")
    assert code == 0 and out.count("raised: Unavailable: server 0 did not answer") == 2 \
        and out.count("client closed: 'configuring the servers failed: Unavailable") == 2 \
        and "open stores: []" in out, out
    session = ("import pstrain, pstrain.kvstore as k\n"
               "kv = pstrain.KVStore('local')\n"
               "kv.close = lambda: print('closed as finished')\n"
               "kv._fail = lambda why: print('failed: ' + why)\n"
               "k._OPEN.append(kv)\n"
               "1 / 0\n"
               "print('the session goes on')\n")
    full = dict(os.environ, DMLC_ROLE="")
    p = subprocess.run([sys.executable, "-i", "-q"], input=session.encode(), env=full,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    out = p.stdout.decode(errors="replace")
    assert p.returncode == 0 and "ZeroDivisionError" in out and "the session goes on" in out \
        and "closed as finished" in out and "failed:" not in out, out
    print("package: store lifecycle ok")


def test_roles():
    code, out = run_python("import pstrain; print('worker goes on')")
    assert code == 0 and "worker goes on" in out, out
    code, out = run_python("import pstrain; print('must not run')", DMLC_ROLE="bogus")
    assert code != 0 and "DMLC_ROLE" in out and "must not run" not in out, out
    # A server without its job's variables: the role fails naming what is missing,
    # and the script body never runs.
    code, out = run_python("import pstrain; print('must not run')", DMLC_ROLE="server")
    assert code == 2 and "DMLC_PS_ROOT_URI" in out and "must not run" not in out, (code, out)
    # Found by review: a dist store (or a DistributedOptimizer, which makes
    # one) in a script run without the launcher said only which variable is
    # missing; it now says how to start the job.
    code, out = run_python("import pstrain; pstrain.KVStore('dist_sync')")
    assert code != 0 and "pstrain.Error" in out.replace("_pstrain.", "pstrain.") \
        and "DMLC_PS_ROOT_URI" in out and "run `pstrain launch -n W -s S -- python3 " in out \
        and "a 'local' KVStore instead" in out, out
    try:
        import torch  # noqa: F401
    except ImportError:
        torch = None
    if torch is not None:
        code, out = run_python(
            "import pstrain, pstrain.torch, torch\n"
            "m = torch.nn.Linear(2, 2)\n"
            "pstrain.torch.DistributedOptimizer(pstrain.optimizer.SGD(learning_rate=0.1), m)\n")
        assert code != 0 and "DMLC_PS_ROOT_URI" in out and "pstrain launch -n W -s S" in out \
            and "DistributedOptimizer needs the servers" in out, out
    print("package: roles ok")


def test_local_store():
    kv = pstrain.KVStore("local")
    assert kv.rank == 0 and kv.num_workers == 1
    # MXNet's spelling: mx.kv.create(name).
    made = pstrain.kv.create("device")
    assert isinstance(made, pstrain.KVStore) and made.type == "device", made
    assert pstrain.kvstore.create().type == "local"
    expect_error(lambda: pstrain.kv.create(3), TypeError, "the store's type name")
    kv.init("w", np.ones((2, 3), np.float32))
    out = np.zeros((2, 3), np.float32)
    # No optimizer: a push stores the sum of its per-device values.
    kv.push("w", [np.full((2, 3), 2, np.float32), np.full((2, 3), 3, np.float32)]).wait()
    kv.pull("w", out=out).wait()
    assert np.all(out == 5), out
    # MXNet's SGD with momentum, against the rule computed in float32 here.
    lr, mom, wd, rescale = np.float32(0.1), np.float32(0.9), np.float32(0.01), np.float32(0.5)
    kv.set_optimizer(pstrain.optimizer.SGD(learning_rate=float(lr), momentum=float(mom),
                                           wd=float(wd), rescale_grad=float(rescale)))
    w = out.copy()
    m = np.zeros_like(w)
    rng = np.random.default_rng(1)
    for _ in range(4):
        g = rng.standard_normal((2, 3)).astype(np.float32)
        kv.push("w", g).wait()
        m = mom * m - lr * (rescale * g + wd * w)
        w = w + m
    kv.pull("w", out=out).wait()
    assert np.array_equal(out, w), (out, w)
    # pushpull returns the updated value at once.
    before = out.copy()
    kv.pushpull("w", np.zeros((2, 3), np.float32), out=out).wait()
    assert not np.array_equal(out, before)
    # The schedules count updates as MXNet's FactorScheduler and MultiFactorScheduler.
    for sched, want in [(pstrain.lr_scheduler.FactorScheduler(step=2, factor=0.5),
                         [1, 1, 0.5, 0.5, 0.25, 0.25]),
                        (pstrain.lr_scheduler.MultiFactorScheduler(step=[1, 3], factor=0.1),
                         [1, 0.1, 0.1, 0.01, 0.01, 0.01])]:
        s = pstrain.KVStore("local")
        s.init(0, np.zeros(1, np.float32))
        s.set_optimizer(pstrain.optimizer.SGD(learning_rate=1.0, lr_scheduler=sched))
        w, rates = np.zeros(1, np.float32), []
        for _ in range(6):
            before = float(w[0])
            s.pushpull(0, np.ones(1, np.float32), out=w).wait()
            rates.append(before - float(w[0]))
        assert np.allclose(rates, want, rtol=1e-6), (type(sched).__name__, rates)
    try:
        kv.push("never", np.ones(3, np.float32))
        raise AssertionError("a push of a key never initialized did not raise")
    except KeyError:
        pass
    # wd_mult naming a key not initialized yet applies once it is (a local
    # store applies the multipliers as the servers do).
    opt = pstrain.optimizer.SGD(learning_rate=0.1, wd=0.5)
    opt.set_wd_mult({"later": 0.0})
    later = pstrain.KVStore("local")
    later.set_optimizer(opt)
    later.init("later", np.ones(2, np.float32))
    later.push("later", np.ones(2, np.float32)).wait()
    got = np.zeros(2, np.float32)
    later.pull("later", out=got).wait()
    assert np.allclose(got, 0.9, rtol=0, atol=1e-7), got
    try:
        pstrain.optimizer.create("adamw")
        raise AssertionError("an unknown optimizer did not raise")
    except ValueError:
        pass
    # A bad setting raises when the optimizer is made, and one changed
    # afterwards when it is set (the C++ check either way).
    expect_error(lambda: pstrain.optimizer.SGD(learning_rate=0.1, momentum=1.5), ValueError,
                 "SGD: momentum 1.5 must be in [0, 1)")
    bad = pstrain.optimizer.SGD(learning_rate=0.1)
    bad.momentum = 1.5
    expect_error(lambda: pstrain.KVStore("local").set_optimizer(bad), pstrain.Error,
                 "momentum 1.5 must be in [0, 1)")
    print("package: local store ok")


def test_python_updater():
    """MXNet's kv._set_updater on local and device stores (its KVStore
    tutorial's example), and what it replaces or refuses."""
    f32 = np.float32
    for kind in ("local", "device"):
        kv = pstrain.KVStore(kind)
        shape = (2, 3)
        kv.init(3, np.ones(shape, f32))
        seen = []

        def update(key, inp, stored):
            seen.append((key, inp.shape, stored.shape))
            stored += inp * 2

        kv._set_updater(update)
        kv.push(3, np.ones(shape, f32)).wait()
        a = np.zeros(shape, f32)
        kv.pull(3, out=a).wait()
        assert np.array_equal(a, np.full(shape, 3, f32)), a
        assert seen == [(3, shape, shape)], seen
        # Several devices' values: their sum is the input.
        kv.push(3, [np.ones(shape, f32)] * 4).wait()
        kv.pull(3, out=a).wait()
        assert np.array_equal(a, np.full(shape, 11, f32)), a
        # pushpull hands back the updated value.
        kv.pushpull(3, np.ones(shape, f32), out=a).wait()
        assert np.array_equal(a, np.full(shape, 13, f32)), a
    # String keys reach it by name; the input is read-only; its exception
    # reaches the caller.
    kv = pstrain.KVStore("local")
    kv.init(["w", "b"], [np.zeros(4, f32), np.zeros(2, f32)])
    names = []
    kv.set_updater(lambda key, inp, stored: names.append(key))
    kv.push(["b", "w"], [np.ones(2, f32), np.ones(4, f32)]).wait()
    assert names == ["b", "w"], names

    def writes_input(key, inp, stored):
        inp[0] = 5

    kv.set_updater(writes_input)
    g = np.ones(4, f32)
    expect_error(lambda: kv.push("w", g).wait(), ValueError, "read-only")
    assert g[0] == 1, g
    # set_optimizer replaces it, as it replaces set_optimizer; None removes it.
    kv.set_optimizer(pstrain.optimizer.SGD(learning_rate=0.5))
    kv.push("w", np.ones(4, f32)).wait()
    out = np.zeros(4, f32)
    kv.pull("w", out=out).wait()
    assert np.array_equal(out, np.full(4, -0.5, f32)), out
    kv.set_updater(lambda key, inp, stored: stored.fill(7))
    kv.push("w", np.ones(4, f32)).wait()
    kv.pull("w", out=out).wait()
    assert np.array_equal(out, np.full(4, 7, f32)), out
    expect_error(lambda: kv.save_optimizer_states("/nonexistent/x"), ValueError,
                 "runs a Python updater (set_updater)")
    kv.set_updater(None)
    kv.push("w", np.full(4, 2, f32)).wait()
    kv.pull("w", out=out).wait()
    assert np.array_equal(out, np.full(4, 2, f32)), out
    expect_error(lambda: kv.set_updater(3), TypeError, "set_updater takes a function")
    print("python updater: MXNet's _set_updater on local and device stores ok")
    # MXNet's is_capable and pull(ignore_sparse=...).
    assert kv.is_capable(pstrain.KVStore.OPTIMIZER) and kv.is_capable("optimizer")
    expect_error(lambda: kv.is_capable("sparse"), ValueError, "unknown capability 'sparse'")
    kv.pull("w", out=out, ignore_sparse=False).wait()
    assert np.array_equal(out, np.full(4, 2, f32)), out


def test_gradient_compression():
    # MXNet's rule: 'local' has none; bad parameters are named.
    expect_error(lambda: pstrain.KVStore("local").set_gradient_compression({"type": "2bit"}),
                 ValueError, "not supported by a 'local' store")
    kv = pstrain.KVStore("device")
    for params, exc, words in [
            ("2bit", TypeError, "takes a dict"),
            ({"type": "2bit", "thresold": 0.5}, ValueError, "unknown parameter 'thresold'"),
            ({"type": "1bit"}, ValueError, "type '1bit' is not a gradient compression"),
            ({"threshold": 0.5}, ValueError, "type None is not"),
            ({"type": "2bit", "threshold": 0}, ValueError, "must be a finite number > 0"),
            ({"type": "2bit", "threshold": float("nan")}, ValueError, "finite number > 0"),
            ({"type": "2bit", "threshold": 1e-50}, ValueError, "in float32's range"),
            ({"type": "2bit", "threshold": 1e39}, ValueError, "in float32's range"),
            ({"type": "2bit", "threshold": "abc"}, ValueError, "'abc' is not a number"),
            ({"type": "2bit", "threshold": True}, ValueError, "True is not a number")]:
        expect_error(lambda: kv.set_gradient_compression(params), exc, *words.split("|"))
    # A device store quantizes each device's value with its own residual, then
    # sums (no optimizer: a push stores the sum). 37 elements: a partial block.
    t = 0.25
    kv.set_gradient_compression({"type": "2bit", "threshold": str(t)})
    kv.init("w", np.zeros(37, np.float32))
    rng = np.random.default_rng(7)
    residuals = [np.zeros(37, np.float32), np.zeros(37, np.float32)]
    out = np.zeros(37, np.float32)
    sent_any = False
    for _ in range(4):
        grads = [(rng.standard_normal(37) * 0.3).astype(np.float32) for _ in range(2)]
        given = [g.copy() for g in grads]
        kv.push("w", grads).wait()
        kv.pull("w", out=out).wait()
        want = np.zeros(37, np.float32)
        for g, res in zip(grads, residuals):
            res += g
            q = np.where(res >= t, np.float32(t), np.where(res <= -t, np.float32(-t),
                                                           np.float32(0))).astype(np.float32)
            res -= q
            want += q
        assert np.array_equal(out, want), (out, want)
        assert all(np.array_equal(g, b) for g, b in zip(grads, given)), "a push changed its input"
        sent_any = sent_any or np.any(want != 0)
    assert sent_any
    # A gradient that compression would make NaN is refused before anything
    # is stored or any residual moves, with no optimizer (a push stores the
    # sum: NaN, and an Inf residual made every later push NaN) ...
    bad = np.zeros(37, np.float32)
    bad[3] = np.inf
    kv.pull("w", out=out).wait()
    kept = out.copy()
    r0 = [r.copy() for r in kv._residuals[0]]
    for value, device in ((bad, 0), ([np.zeros(37, np.float32), bad], 1)):
        expect_error(lambda: kv.push("w", value), pstrain.Error, "FailedPrecondition",
                     "push of key 'w': the gradient of device %d" % device,
                     "holds NaN or Inf", "weights were left as they were")
    expect_error(lambda: kv.pushpull("w", bad, out=np.zeros(37, np.float32)), pstrain.Error,
                 "pushpull of key 'w'", "holds NaN or Inf")
    assert len(kv._residuals[0]) == len(r0), (len(kv._residuals[0]), len(r0))
    assert all(np.array_equal(a, b) for a, b in zip(kv._residuals[0], r0))
    kv.pull("w", out=out).wait()
    assert np.array_equal(out, kept), (out, kept)
    # ... and with one.
    kv.set_optimizer(pstrain.optimizer.SGD(learning_rate=0.1))
    expect_error(lambda: kv.push("w", bad), pstrain.Error, "holds NaN or Inf",
                 "weights were left as they were")
    kv.pull("w", out=out).wait()
    assert np.array_equal(out, kept), (out, kept)
    # ... and its residual: a finite push after it is applied (an Inf residual
    # made every later push NaN, refused for good).
    kv.push("w", np.full(37, 0.3, np.float32)).wait()
    kv.pull("w", out=out).wait()
    assert np.all(np.isfinite(out)) and not np.array_equal(out, kept), out
    # A pushpull refused for its output moves no residual either: pushing the
    # same value again sends what one push sends.
    kv.set_optimizer(pstrain.optimizer.Test(rescale_grad=1.0))
    r0 = [r.copy() for r in kv._residuals[0]]
    expect_error(lambda: kv.pushpull("w", np.full(37, 0.2, np.float32),
                                     out=np.zeros(5, np.float32)), ValueError, "output has 5")
    assert all(np.array_equal(a, b) for a, b in zip(kv._residuals[0], r0))
    # Off: the sum arrives whole.
    kv.set_gradient_compression({"type": "none"})
    kv.set_optimizer(pstrain.optimizer.Test(rescale_grad=1.0))
    kv.pushpull("w", np.full(37, 0.1, np.float32), out=out).wait()
    before = out.copy()
    kv.pushpull("w", np.full(37, 0.1, np.float32), out=out).wait()
    assert np.array_equal(out, before + np.float32(0.1)), (out, before)
    # The C++ round trip refuses what would corrupt memory.
    expect_error(lambda: pstrain._pstrain.quantize_2bit(np.zeros(4, np.float32),
                                                        np.zeros(5, np.float32), 0.5),
                 ValueError, "the residual has 5 elements, the gradient 4")
    g = np.zeros(4, np.float32)
    expect_error(lambda: pstrain._pstrain.quantize_2bit(g, g, 0.5), ValueError, "same buffer")
    print("package: gradient compression ok")


def test_optimizer_states():
    import tempfile
    tmp = tempfile.mkdtemp(prefix="pstrain-states-")
    shapes = {"a": (3, 4), "b": (5,)}
    rng = np.random.default_rng(5)
    grads = [{k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
             for _ in range(5)]

    def sgd():
        return pstrain.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=1e-3,
                                     lr_scheduler=pstrain.lr_scheduler.FactorScheduler(2, 0.5))

    def store(values, opt=True):
        kv = pstrain.KVStore("local")
        kv.init(list(values), list(values.values()))
        if opt:
            kv.set_optimizer(sgd())
        return kv

    def pull(kv):
        out = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
        kv.pull(list(out), out=list(out.values())).wait()
        return out

    kv = store({k: np.ones(s, np.float32) for k, s in shapes.items()})
    for g in grads[:3]:
        kv.push(list(g), list(g.values())).wait()
    mid = pull(kv)
    path = os.path.join(tmp, "states")
    kv.save_optimizer_states(path, dump_optimizer=True)
    kv.save_optimizer_states(path + ".bare")
    assert os.path.exists(path), "saved under another name"
    for g in grads[3:]:
        kv.push(list(g), list(g.values())).wait()
    want = pull(kv)
    # Resumed from the weights and the states: bit for bit (momentum and the
    # schedule's clock, which halves the rate at update 4), with the optimizer
    # from the file or set again.
    for file, opt in [(path, False), (path + ".bare", True)]:
        again = store(mid, opt=opt)
        again.load_optimizer_states(file)
        for g in grads[3:]:
            again.push(list(g), list(g.values())).wait()
        got = pull(again)
        for k in shapes:
            assert np.array_equal(got[k], want[k]), (file, k, got[k], want[k])
    # Without the states the momentum starts again: not the same weights.
    fresh = store(mid)
    for g in grads[3:]:
        fresh.push(list(g), list(g.values())).wait()
    assert not np.array_equal(pull(fresh)["a"], want["a"])
    # Errors name the file and what is wrong.
    expect_error(lambda: store(mid, opt=False).load_optimizer_states(path + ".bare"), ValueError,
                 "holds no optimizer", "set_optimizer first")
    expect_error(lambda: pstrain.KVStore("local").load_optimizer_states(path), ValueError,
                 "key 'a' was never initialized")
    small = pstrain.KVStore("local")
    small.init(["a", "b"], [np.ones(12, np.float32), np.ones(4, np.float32)])
    expect_error(lambda: small.load_optimizer_states(path), ValueError,
                 "key 'b': state of 5 float32 values, but 1 slot(s) ['momentum'] of a key of 4 "
                 "hold 4")
    with open(path + ".junk", "wb") as f:
        f.write(b"not an npz file")
    expect_error(lambda: kv.load_optimizer_states(path + ".junk"), ValueError,
                 "load_optimizer_states: " + path + ".junk")
    expect_error(lambda: kv.load_optimizer_states(path + ".missing"), ValueError, "No such file")
    # A file cut short (a save killed midway wrote one before saves were
    # renamed into place) and a meta or entry of the wrong kind name the file too.
    with open(path, "rb") as f:
        whole = f.read()
    with open(path + ".cut", "wb") as f:
        f.write(whole[:len(whole) // 2])
    expect_error(lambda: kv.load_optimizer_states(path + ".cut"), ValueError,
                 "load_optimizer_states: " + path + ".cut")
    open(path + ".empty", "wb").close()
    expect_error(lambda: kv.load_optimizer_states(path + ".empty"), ValueError,
                 "load_optimizer_states: " + path + ".empty")

    def written(name, meta, momenta):
        arrays = {"m%d" % i: m for i, m in enumerate(momenta)}
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        with open(os.path.join(tmp, name), "wb") as out:
            np.savez(out, **arrays)
        return os.path.join(tmp, name)

    m12 = np.zeros(12, np.float32)
    good = {"format": "pstrain optimizer states", "version": 1, "num_update": 3,
            "optimizer": None, "keys": [["a", 3, 1.0, 1.0]]}
    for name, meta, words in [
            ("list", [1, 2], "not a pstrain optimizer state file"),
            ("count", dict(good, num_update=-1), "-1 is not a count"),
            ("updates", dict(good, keys=[["a", "3", 1.0, 1.0]]), "key entry 0 is malformed"),
            ("huge", dict(good, keys=[["a", 2**64, 1.0, 1.0]]), "key entry 0 is malformed"),
            ("mult", dict(good, keys=[["a", 3, "x", 1.0]]), "key entry 0 is malformed"),
            ("big", dict(good, keys=[["a", 3, 10**400, 1.0]]), "key entry 0 is malformed")]:
        f = written(name, meta, [m12])
        expect_error(lambda: kv.load_optimizer_states(f), ValueError,
                     "load_optimizer_states: " + f, words)
    # A load that fails on a fresh store does not fix the store's kind of key.
    fresh = pstrain.KVStore("local")
    expect_error(lambda: fresh.load_optimizer_states(path), ValueError, "never initialized")
    fresh.init(3, np.ones(4, np.float32))
    # A save replaces the file whole and leaves nothing beside it.
    before = sorted(os.listdir(tmp))
    kv.save_optimizer_states(path)
    assert sorted(os.listdir(tmp)) == before, (before, os.listdir(tmp))
    expect_error(lambda: kv.save_optimizer_states(os.path.join(tmp, "no", "such")), OSError)
    assert sorted(os.listdir(tmp)) == before, (before, os.listdir(tmp))
    expect_error(lambda: pstrain.KVStore("local").save_optimizer_states(path), ValueError,
                 "no optimizer")
    print("package: optimizer states ok")


def test_torch_zero_copy():
    try:
        import torch
    except ImportError:
        print("package: torch not installed: zero-copy cases skipped")
        return
    # allreduce in a local store (one worker): the tensor itself, as a copy.
    import pstrain.torch as pt
    local = pstrain.KVStore("local")
    t = torch.arange(6.0).reshape(2, 3)
    got = pt.allreduce(t, kvstore=local)
    assert torch.equal(got, t) and got.data_ptr() != t.data_ptr(), got
    assert torch.equal(pt.allreduce(t, op=pt.Sum, name="x", kvstore=local), t)
    expect_error(lambda: pt.allreduce(t, op="max", kvstore=local), ValueError, "Average or Sum")
    assert pt.allreduce(torch.zeros(0, 3), kvstore=local).shape == (0, 3)
    h = pt.allreduce_async(t, kvstore=local)
    assert pt.poll(h) and torch.equal(pt.synchronize(h), t)
    assert pt.synchronize(pt.allreduce_async(torch.zeros(0, 2), kvstore=local)).shape == (0, 2)
    expect_error(lambda: pt.synchronize(3), TypeError, "what allreduce_async returned")
    assert torch.equal(pt.broadcast(t, 0, kvstore=local), t)
    assert torch.equal(pt.allgather(t, kvstore=local), t)
    expect_error(lambda: pt.broadcast(t, 1, kvstore=local), ValueError, "root_rank 1 is not in")
    expect_error(lambda: pt.allgather(torch.tensor(1.0), kvstore=local), ValueError,
                 "no first dimension")
    expect_error(lambda: pt.allreduce(torch.zeros(2, dtype=torch.complex64), kvstore=local),
                 TypeError, "complex tensors are not supported")
    kv = pstrain.KVStore("local")
    t = torch.arange(6, dtype=torch.float32)
    kv.init(0, t)
    dst = torch.zeros(6)
    h = kv.pull(0, out=dst)
    h.wait()
    assert torch.equal(dst, t)
    # A tensor that can be used in place is: the buffer handed to C++ shares its memory.
    from pstrain.kvstore import _dest, _source
    arr, copy_back = _dest(dst, "out")
    assert copy_back is None and arr.__array_interface__["data"][0] == dst.data_ptr()
    p = torch.nn.Parameter(torch.ones(6))
    assert _source(p, "value").__array_interface__["data"][0] == p.data_ptr()
    # One that cannot (float64, strided) goes through a copy and comes back on wait().
    wide = torch.zeros(6, 2, dtype=torch.float64)[:, 0]
    kv.pull(0, out=wide).wait()
    assert torch.equal(wide, t.double()), wide
    print("package: torch tensors ok")


def main():
    test_roles()
    test_local_store()
    test_python_updater()
    test_gradient_compression()
    test_optimizer_states()
    test_torch_zero_copy()
    test_lost_errors()
    test_pull_after_failed_push()
    test_repeated_keys()
    test_output_sizes()
    test_shapes()
    test_settle()
    test_keys_and_timeouts()
    test_init_values()
    test_mnist_example_finds_data()
    test_store_lifecycle()
    print("package: all ok")


if __name__ == "__main__":
    main()
