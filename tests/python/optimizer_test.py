"""The optimizers beyond SGD from Python, against MXNet 1.x's rules in NumPy.

  --mode local      (no cluster; tests/unit/python_package_test.cc) a local
                    store with NAG, Adam, RMSProp (plain and centered) and
                    AdaGrad against an independent float32 NumPy version of
                    MXNet's update (optimizer.py and the update operators);
                    the classes' MXNet defaults and their errors; per-key
                    lr_mult and wd_mult; optimizer
                    states saved and loaded for every type (the next updates
                    equal an unbroken run's), refused for another optimizer;
                    pstrain.torch.server_optimizer against torch.optim (with
                    parameter groups of their own lr and weight_decay too),
                    and what it refuses (when torch imports).
  --mode dist_sync  (under `pstrain launch -n 2 -s 2`; tests/cluster/
                    python_cluster_test.cc) the servers' updates of the sum of
                    both workers' pushes against the same NumPy rules, with a
                    key sharded over both servers, and with per-key
                    multipliers; a DistributedOptimizer over
                    server_optimizer(torch.optim.Adam) against torch's Adam on
                    the averaged gradients (when torch imports).

Exits non-zero (an exception) on any failure.
"""
import argparse
import json
import math
import os
import sys
import tempfile

import numpy as np

import pstrain

F32 = np.float32


# ---- MXNet 1.x's rules, written from its optimizer.py and update operators ----

class Reference:
    """One key's MXNet update in float32 NumPy, from the optimizer's settings
    (to_dict). The learning rate per update is given (the schedule's)."""

    def __init__(self, cfg, shape):
        self.c = cfg
        self.t = 0
        self.mom = np.zeros(shape, F32)  # sgd, nag
        self.mean = np.zeros(shape, F32)  # adam
        self.var = np.zeros(shape, F32)
        self.n = np.zeros(shape, F32)  # rmsprop
        self.g = np.zeros(shape, F32)
        self.delta = np.zeros(shape, F32)
        self.history = np.zeros(shape, F32)  # adagrad

    def _clip(self, x):
        c = self.c.get("clip_gradient")
        return x if c is None else np.clip(x, -F32(c), F32(c))

    def step(self, w, grad, lr):
        """The weights after one update of w with grad at rate lr."""
        c, self.t = self.c, self.t + 1
        lr, wd = F32(lr), F32(c["wd"])
        g = F32(c["rescale_grad"]) * grad
        kind = c["type"]
        if kind == "sgd":
            m = F32(c["momentum"])
            step = lr * (self._clip(g) + wd * w)
            if m == 0:
                return w - step
            self.mom = m * self.mom - step
            return w + self.mom
        if kind == "nag":
            m = F32(c["momentum"])
            g = self._clip(g)
            if m == 0:
                return w - lr * (g + wd * w)
            # nag_mom_update (MXNet 1.6+): mom' = m * mom;
            # w = w - mom' + (m + 1) * (mom' - lr * (g + wd * w)); mom = mom' - lr * (...)
            step = lr * (g + wd * w)
            mom = m * self.mom
            self.mom = mom - step
            return w - mom + (m + F32(1)) * (mom - step)
        if kind == "adam":
            b1, b2, eps = F32(c["beta1"]), F32(c["beta2"]), F32(c["epsilon"])
            # Adam.update folds the bias correction into lr, in Python floats.
            coef1 = 1.0 - float(b1) ** self.t
            coef2 = 1.0 - float(b2) ** self.t
            lr_t = F32(float(lr) * math.sqrt(coef2) / coef1)
            g = self._clip(g + wd * w)
            self.mean = b1 * self.mean + (F32(1) - b1) * g
            self.var = b2 * self.var + (F32(1) - b2) * g * g
            return w - lr_t * self.mean / (np.sqrt(self.var) + eps)
        if kind == "rmsprop":
            g1, g2, eps = F32(c["gamma1"]), F32(c["gamma2"]), F32(c["epsilon"])
            g = self._clip(g + wd * w)
            self.n = (F32(1) - g1) * g * g + g1 * self.n
            if c["centered"]:
                self.g = (F32(1) - g1) * g + g1 * self.g
                self.delta = g2 * self.delta - lr * (g / np.sqrt(self.n - self.g * self.g + eps))
                w = w + self.delta
            else:
                w = w - lr * (g / np.sqrt(self.n + eps))
            cw = c.get("clip_weights")
            return w if cw is None else np.clip(w, -F32(cw), F32(cw))
        if kind == "adagrad":
            eps = F32(c["epsilon"])
            g = self._clip(g)
            self.history = self.history + g * g
            return w - lr * (g / np.sqrt(self.history + eps) + wd * w)
        raise AssertionError("no reference for %r" % (kind,))


def lr_at(opt, num_update):
    """MXNet's FactorScheduler's rate for the num_update-th update (or the constant)."""
    s = opt.lr_scheduler
    if s is None:
        return opt.learning_rate
    return opt.learning_rate * s.factor ** ((num_update - 1) // s.step)


def close(got, want, what, rtol=2e-6):
    """got equals want to float32 rounding: max |got - want| <= rtol * max(1, |want|)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    err = float(np.max(np.abs(got - want)))
    scale = max(1.0, float(np.max(np.abs(want))))
    if not err <= rtol * scale:
        raise AssertionError("%s: max |diff| %g (weights up to %g, tolerance %g)"
                             % (what, err, scale, rtol * scale))
    return err


def expect_error(fn, exc, *words):
    try:
        fn()
    except exc as e:
        for w in words:
            assert w in str(e), (w, str(e))
        return e
    raise AssertionError("%s did not raise %s" % (fn, exc.__name__))


def configs():
    """(label, optimizer) for every new rule: momentum, weight decay, rescale,
    both clips and a schedule along the way."""
    O = pstrain.optimizer
    sched = pstrain.lr_scheduler.FactorScheduler(step=2, factor=0.5)
    return [
        ("nag", O.NAG(learning_rate=0.1, momentum=0.9, wd=0.01, rescale_grad=0.5,
                      clip_gradient=0.8)),
        # (MXNet 1.6+'s NAG keeps its momentum times the rate: it parts from
        # the older form when the rate changes.)
        ("nag scheduled", O.NAG(learning_rate=0.1, momentum=0.9,
                                lr_scheduler=pstrain.lr_scheduler.FactorScheduler(step=2,
                                                                                  factor=0.5))),
        ("nag momentum 0", O.NAG(learning_rate=0.1, wd=0.01)),
        ("adam", O.Adam(learning_rate=0.01, wd=0.01, rescale_grad=0.5, clip_gradient=0.4,
                        lr_scheduler=sched)),
        ("adam defaults", O.Adam()),
        ("rmsprop", O.RMSProp(learning_rate=0.01, wd=0.01, rescale_grad=0.5, clip_gradient=1.0,
                              clip_weights=1.02)),
        ("rmsprop centered", O.RMSProp(learning_rate=0.01, gamma1=0.95, gamma2=0.8, wd=0.01,
                                       centered=True, clip_weights=1.02)),
        ("adagrad", O.AdaGrad(learning_rate=0.1, wd=0.01, rescale_grad=0.5, clip_gradient=0.8)),
    ]


# ---- local store ----

def test_local_rules():
    shapes = {"a": (3, 4), "b": (7,)}
    rng = np.random.default_rng(11)
    for label, opt in configs():
        kv = pstrain.KVStore("local")
        w = {k: (np.ones(s, F32) + F32(0.1) * rng.standard_normal(s).astype(F32))
             for k, s in shapes.items()}
        kv.init(list(w), list(w.values()))
        kv.set_optimizer(opt)
        refs = {k: Reference(opt.to_dict(), s) for k, s in shapes.items()}
        out = {k: np.zeros(s, F32) for k, s in shapes.items()}
        worst = 0.0
        for i in range(1, 7):
            g = {k: rng.standard_normal(s).astype(F32) for k, s in shapes.items()}
            if i % 2:
                kv.push(list(g), list(g.values())).wait()
                kv.pull(list(out), out=list(out.values())).wait()
            else:
                kv.pushpull(list(g), list(g.values()), out=list(out.values())).wait()
            for k in shapes:
                w[k] = refs[k].step(w[k], g[k], lr_at(opt, i))
                worst = max(worst, close(out[k], w[k], "%s, update %d, key %s" % (label, i, k)))
        print("optimizers: local %s vs MXNet's rule in NumPy: 6 updates, max |diff| %g"
              % (label, worst))
    print("optimizers: local rules ok")


def scaled(opt, lr_mult, wd_mult):
    """(opt's settings with wd times wd_mult, its rate times lr_mult) as the
    Reference takes them: the float32 products the servers form."""
    cfg = dict(opt.to_dict())
    cfg["wd"] = float(F32(cfg["wd"]) * F32(wd_mult))
    return cfg, lambda lr: float(F32(lr) * F32(lr_mult))


def test_multipliers():
    """MXNet's Optimizer.set_lr_mult / set_wd_mult on a local store: each key's
    rate and decay times its multipliers (named before init too); a second
    set_optimizer brings its own; a saved optimizer brings them back."""
    O = pstrain.optimizer
    shapes = {"a": (3, 4), "b": (5,), "c": (2, 2)}
    lr_mult, wd_mult = {"a": 0.5, "later": 3.0}, {"b": 0.0, "c": 2.0}
    rng = np.random.default_rng(17)
    for label, opt in [("sgd", O.SGD(learning_rate=0.1, momentum=0.9, wd=0.05)),
                       ("adam", O.Adam(learning_rate=0.01, wd=0.05)),
                       ("adagrad", O.AdaGrad(learning_rate=0.1, wd=0.05))]:
        opt.set_lr_mult(lr_mult)
        opt.set_wd_mult(wd_mult)
        kv = pstrain.KVStore("local")
        kv.set_optimizer(opt)  # before init: "later" is numbered, never used
        w = {k: np.ones(s, F32) for k, s in shapes.items()}
        kv.init(list(w), [x.copy() for x in w.values()])
        refs = {}
        for k, s in shapes.items():
            cfg, rate = scaled(opt, lr_mult.get(k, 1.0), wd_mult.get(k, 1.0))
            refs[k] = (Reference(cfg, s), rate)
        out = {k: np.zeros(s, F32) for k, s in shapes.items()}
        for i in range(1, 5):
            g = {k: rng.standard_normal(s).astype(F32) for k, s in shapes.items()}
            kv.pushpull(list(g), list(g.values()), out=list(out.values())).wait()
            for k, (ref, rate) in refs.items():
                w[k] = ref.step(w[k], g[k], rate(opt.learning_rate))
                close(out[k], w[k], "local %s with multipliers, update %d, key %s" % (label, i, k))
    # A saved optimizer (dump_optimizer) comes back with its multipliers.
    tmp = tempfile.mkdtemp(prefix="pstrain-mults-")
    # "frozen" (lr_mult 0) is never pushed before the save: it has no state,
    # and its multiplier comes back all the same.
    opt = O.SGD(learning_rate=0.1, wd=0.5)
    opt.set_lr_mult({"a": 0.25, "frozen": 0.0})
    opt.set_wd_mult({"a": 0.0})
    kv = pstrain.KVStore("local")
    kv.init(["a", "frozen"], [np.ones(4, F32), np.ones(4, F32)])
    kv.set_optimizer(opt)
    kv.push("a", np.ones(4, F32)).wait()
    kv.save_optimizer_states(os.path.join(tmp, "s.npz"), dump_optimizer=True)
    fresh = pstrain.KVStore("local")
    fresh.init(["a", "frozen"], [np.ones(4, F32), np.ones(4, F32)])
    fresh.load_optimizer_states(os.path.join(tmp, "s.npz"))
    fresh.push(["a", "frozen"], [np.ones(4, F32), np.ones(4, F32)]).wait()
    got, frozen = np.zeros(4, F32), np.zeros(4, F32)
    fresh.pull(["a", "frozen"], out=[got, frozen]).wait()
    close(got, np.full(4, 1 - 0.1 * 0.25, F32), "loaded optimizer's lr_mult and wd_mult")
    assert np.array_equal(frozen, np.ones(4, F32)), ("lr_mult 0 of a key without state", frozen)
    # Another set_optimizer brings its own multipliers (none here).
    kv.set_optimizer(O.SGD(learning_rate=0.1, wd=0.5))
    kv.push("a", np.ones(4, F32)).wait()
    kv.pull("a", out=got).wait()
    before = F32(1 - 0.1 * 0.25)
    close(got, np.full(4, before - F32(0.1) * (F32(1) + F32(0.5) * before), F32),
          "a second set_optimizer without multipliers")
    # Refused, naming the key.
    expect_error(lambda: O.SGD().set_lr_mult({"a": float("inf")}), ValueError,
                 "SGD: lr_mult['a'] is inf: a multiplier must be finite")
    expect_error(lambda: O.SGD().set_wd_mult([("a", 1.0)]), TypeError, "takes a dict")
    expect_error(lambda: O.SGD().set_lr_mult({1.5: 1.0}), TypeError, "not a KVStore key")
    late = O.SGD()
    late.lr_mult = {"a": "x"}
    expect_error(lambda: pstrain.KVStore("local").set_optimizer(late), TypeError,
                 "set_optimizer: lr_mult['a'] must be a number, got 'x'")
    print("optimizers: lr_mult and wd_mult on a local store ok")


def test_classes():
    O = pstrain.optimizer
    # MXNet 1.x's constructors and defaults.
    a = O.Adam()
    assert (a.learning_rate, a.beta1, a.beta2, a.epsilon, a.wd) == (0.001, 0.9, 0.999, 1e-8, 0.0)
    r = O.RMSProp()
    assert (r.learning_rate, r.gamma1, r.gamma2, r.epsilon, r.centered, r.clip_weights) == \
        (0.001, 0.9, 0.9, 1e-8, False, None)
    g = O.AdaGrad()
    assert (g.learning_rate, g.eps) == (0.01, 1e-7) and g.to_dict()["epsilon"] == 1e-7
    n = O.NAG()
    assert (n.learning_rate, n.momentum) == (0.01, 0.0)
    for name, cls in [("sgd", O.SGD), ("nag", O.NAG), ("adam", O.Adam), ("RMSProp", O.RMSProp),
                      ("adagrad", O.AdaGrad), ("test", O.Test)]:
        assert type(O.create(name)) is cls, name
    assert type(O.create("adam", beta1=0.5)) is O.Adam and O.create("adam", beta1=0.5).beta1 == 0.5
    assert not isinstance(O.NAG(), O.SGD)
    assert repr(O.AdaGrad(eps=1e-6)).startswith("AdaGrad(") and "eps=1e-06" in repr(O.AdaGrad(
        eps=1e-6))
    assert set(O.__all__) >= {"NAG", "Adam", "RMSProp", "AdaGrad"}
    expect_error(lambda: O.create("adamw"), ValueError, "unknown optimizer 'adamw'",
                 "adagrad, adam, nag, rmsprop, sgd, test")
    # Bad values raise at construction, naming the setting (the servers' check).
    for make, words in [
            (lambda: O.Adam(beta1=1.0), "Adam: beta1 1 must be in [0, 1)"),
            (lambda: O.Adam(beta2=-0.1), "beta2 -0.1 must be in [0, 1)"),
            (lambda: O.Adam(epsilon=0), "epsilon 0 must be finite and > 0"),
            (lambda: O.RMSProp(gamma1=1.5), "gamma1 1.5 must be in [0, 1)"),
            (lambda: O.RMSProp(gamma2=float("nan")), "gamma2 nan must be in [0, 1)"),
            (lambda: O.AdaGrad(eps=-1e-7), "epsilon -1e-07 must be finite and > 0"),
            (lambda: O.NAG(momentum=1.5), "momentum 1.5 must be in [0, 1)"),
            (lambda: O.Adam(learning_rate=-1), "learning rate -1 must be >= 0"),
            (lambda: O.AdaGrad(wd=-0.1), "wd -0.1 must be finite and >= 0"),
            (lambda: O.RMSProp(clip_weights=float("nan")), "clip_weights is NaN"),
            (lambda: O.Adam(clip_gradient=float("nan")), "clip_gradient is NaN")]:
        expect_error(make, ValueError, words)
    expect_error(lambda: O.Adam(beta1="x"), TypeError, "Adam: beta1 must be a number, got 'x'")
    expect_error(lambda: O.RMSProp(centered=1), TypeError, "centered must be True or False")
    expect_error(lambda: O.Adam(momentum=0.9), TypeError, "momentum")
    # A setting changed after construction is refused by set_optimizer.
    late = O.Adam()
    late.beta2 = 1.0
    kv = pstrain.KVStore("local")
    expect_error(lambda: kv.set_optimizer(late), pstrain.Error, "beta2 1 must be in [0, 1)")
    print("optimizers: classes, defaults and errors ok")


def test_states():
    """save/load round-trips every type; another type's (or layout's) state is
    refused; version 1 files (sgd's momentum) still load into sgd."""
    tmp = tempfile.mkdtemp(prefix="pstrain-opt-states-")
    shapes = {"a": (3, 4), "b": (5,)}
    rng = np.random.default_rng(5)
    grads = [{k: rng.standard_normal(s).astype(F32) for k, s in shapes.items()}
             for _ in range(6)]
    start = {k: np.ones(s, F32) for k, s in shapes.items()}
    O = pstrain.optimizer

    def store(values, opt):
        kv = pstrain.KVStore("local")
        kv.init(list(values), [v.copy() for v in values.values()])
        if opt is not None:
            kv.set_optimizer(opt)
        return kv

    def push(kv, gs):
        for g in gs:
            kv.push(list(g), list(g.values())).wait()

    def pull(kv):
        out = {k: np.zeros(s, F32) for k, s in shapes.items()}
        kv.pull(list(out), out=list(out.values())).wait()
        return out

    makers = dict(configs())
    makers["sgd"] = O.SGD(learning_rate=0.1, momentum=0.9, wd=1e-3)
    files = {}
    for label, opt in makers.items():
        kv = store(start, opt)
        push(kv, grads[:3])
        mid = pull(kv)
        path = os.path.join(tmp, label.replace(" ", "_"))
        kv.save_optimizer_states(path, dump_optimizer=True)
        kv.save_optimizer_states(path + ".bare")
        files[label] = path
        push(kv, grads[3:])
        want = pull(kv)
        for file, again in [(path, store(mid, None)), (path + ".bare", store(mid, opt))]:
            again.load_optimizer_states(file)
            push(again, grads[3:])
            got = pull(again)
            for k in shapes:
                assert np.array_equal(got[k], want[k]), (label, file, k, got[k], want[k])
        if label != "nag momentum 0":
            # Without the states the rule starts again: not the same weights.
            fresh = store(mid, opt)
            push(fresh, grads[3:])
            assert not np.array_equal(pull(fresh)["a"], want["a"]), label
    print("optimizers: states saved and loaded, every type: the next updates equal an unbroken "
          "run's ok")

    with np.load(files["adam"], allow_pickle=False) as z:
        meta = json.loads(z["meta"].tobytes().decode())
        sizes = [z["s%d" % i].size for i in range(len(meta["keys"]))]
    assert meta["version"] == 2 and meta["optimizer_type"] == "adam" and \
        meta["slots"] == ["mean", "var"], meta
    assert sizes == [24, 10], sizes  # mean and var, back to back, per key
    # Another optimizer's state is refused, naming the file and both types.
    mid = {k: np.ones(s, F32) for k, s in shapes.items()}
    for file, opt, words in [
            (files["adam"] + ".bare", makers["sgd"],
             ["written by the adam optimizer", "this store's is sgd"]),
            (files["sgd"] + ".bare", makers["nag"],
             ["written by the sgd optimizer", "this store's is nag"]),
            (files["rmsprop centered"] + ".bare", makers["rmsprop"],
             ["holds ['n', 'g', 'delta']", "rmsprop keeps ['n']"]),
            (files["sgd"] + ".bare", O.SGD(learning_rate=0.1),
             ["holds ['momentum']", "sgd keeps nothing"])]:
        expect_error(lambda: store(mid, opt).load_optimizer_states(file), ValueError,
                     "load_optimizer_states: " + file, *words)
    # A state that kept nothing (sgd without momentum) loads into one that keeps some.
    kv = store(mid, O.SGD(learning_rate=0.1))
    push(kv, grads[:2])
    kv.save_optimizer_states(os.path.join(tmp, "plain"))
    store(mid, makers["sgd"]).load_optimizer_states(os.path.join(tmp, "plain"))

    def rewrite(src, dst, edit):
        with np.load(src, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        meta = json.loads(arrays.pop("meta").tobytes().decode())
        meta, arrays = edit(meta, arrays)
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        with open(dst, "wb") as f:
            np.savez(f, **arrays)
        return dst

    def cut(meta, arrays):
        arrays["s1"] = arrays["s1"][:-1]
        return meta, arrays
    bad = rewrite(files["adam"], os.path.join(tmp, "cut"), cut)
    expect_error(lambda: store(mid, None).load_optimizer_states(bad), ValueError,
                 "load_optimizer_states: " + bad,
                 "key 'b': state of 9 float32 values, but 2 slot(s) ['mean', 'var'] of a key of 5 "
                 "hold 10")

    def lie(meta, arrays):
        return dict(meta, optimizer_type="sgd"), arrays
    bad = rewrite(files["adam"], os.path.join(tmp, "lie"), lie)
    expect_error(lambda: store(mid, None).load_optimizer_states(bad), ValueError,
                 "written by the sgd optimizer", "this store's is adam")

    # Version 1 (before these optimizers): sgd's momentum as m<i>; it resumes
    # an sgd run as before, and no other type takes it.
    def v1(meta, arrays):
        meta = {k: meta[k] for k in ("format", "num_update", "keys", "optimizer")}
        meta["version"] = 1
        return meta, {"m%d" % i: arrays["s%d" % i] for i in range(len(meta["keys"]))}
    old = rewrite(files["sgd"] + ".bare", os.path.join(tmp, "v1"), v1)
    kv = store(start, makers["sgd"])
    push(kv, grads[:3])
    mid = pull(kv)
    push(kv, grads[3:])
    want = pull(kv)
    again = store(mid, makers["sgd"])
    again.load_optimizer_states(old)
    push(again, grads[3:])
    got = pull(again)
    assert all(np.array_equal(got[k], want[k]) for k in shapes), "a version 1 file resumes sgd"
    expect_error(lambda: store(mid, makers["adam"]).load_optimizer_states(old), ValueError,
                 "load_optimizer_states: " + old, "version 1 file holds sgd's momentum",
                 "optimizer is adam")
    print("optimizers: another optimizer's state refused, version 1 files load into sgd ok")


# ---- pstrain.torch.server_optimizer ----

def torch_run(make_opt, params0, grads):
    """torch's weights after stepping make_opt(params) over grads."""
    import torch
    params = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in params0]
    opt = make_opt(params)
    for gs in grads:
        for p, g in zip(params, gs):
            p.grad = torch.from_numpy(g.copy())
        opt.step()
    return [p.detach().numpy() for p in params]


def store_run(opt, params0, grads, keys=None):
    """A local store's weights after pushing grads with the servers' optimizer opt."""
    kv = pstrain.KVStore("local")
    keys = list(range(len(params0))) if keys is None else keys
    kv.init(keys, [p.copy() for p in params0])
    kv.set_optimizer(opt)
    for gs in grads:
        kv.push(keys, list(gs)).wait()
    out = [np.zeros_like(p) for p in params0]
    kv.pull(keys, out=out).wait()
    return out


def test_torch_mapping():
    try:
        import torch
    except ImportError:
        print("optimizers: torch not installed: server_optimizer cases skipped")
        return
    import pstrain.torch as pt
    O = pstrain.optimizer
    rng = np.random.default_rng(3)
    shapes = [(4, 5), (5,)]
    params0 = [rng.standard_normal(s).astype(F32) for s in shapes]
    grads = [[rng.standard_normal(s).astype(F32) for s in shapes] for _ in range(8)]
    t = torch.optim
    # (label, torch optimizer, class mapped to, tolerance): SGD and NAG to
    # float rounding; the adaptive rules also by where eps enters (torch's
    # 1e-8 on gradients of order 1).
    cases = [
        ("SGD", lambda p: t.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01), O.SGD, 2e-6),
        ("SGD nesterov", lambda p: t.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01,
                                         nesterov=True), O.NAG, 2e-6),
        ("Adam", lambda p: t.Adam(p, lr=0.01, betas=(0.8, 0.99), eps=1e-8, weight_decay=0.01),
         O.Adam, 2e-6),
        ("RMSprop", lambda p: t.RMSprop(p, lr=0.01, alpha=0.9, weight_decay=0.01), O.RMSProp,
         2e-6),
        ("RMSprop centered", lambda p: t.RMSprop(p, lr=0.01, alpha=0.9, momentum=0.5,
                                                 centered=True, weight_decay=0.01), O.RMSProp,
         2e-6),
        ("Adagrad", lambda p: t.Adagrad(p, lr=0.1, eps=1e-10), O.AdaGrad, 2e-6),
    ]
    for label, make, cls, tol in cases:
        mapped = pt.server_optimizer(make([torch.nn.Parameter(torch.zeros(1))]))
        assert type(mapped) is cls, (label, mapped)
        want = torch_run(make, params0, grads)
        got = store_run(mapped, params0, grads)
        err = max(close(g, w, "server_optimizer(torch %s) vs torch" % label, tol)
                  for g, w in zip(got, want))
        print("optimizers: server_optimizer(torch %s) = %r vs torch: max |diff| %g"
              % (label, mapped, err))
    # Groups that differ in lr and weight_decay (no decay for the bias, a
    # smaller rate for it): the largest of each, and per-parameter multipliers.
    for label, make, tol in [
            ("SGD", lambda ps, **kw: t.SGD(ps, momentum=0.9, **kw), 2e-6),
            ("Adam", lambda ps, **kw: t.Adam(ps, **kw), 2e-6)]:
        def grouped(p):
            return make([{"params": [p[0]], "lr": 0.05, "weight_decay": 0.01},
                         {"params": [p[1]], "lr": 0.0125, "weight_decay": 0.0}])
        named = [("fc.weight", torch.nn.Parameter(torch.zeros(shapes[0]))),
                 ("fc.bias", torch.nn.Parameter(torch.zeros(shapes[1])))]
        mapped = pt.server_optimizer(grouped([p for _, p in named]), named)
        assert mapped.learning_rate == 0.05 and mapped.wd == 0.01, mapped
        assert mapped.lr_mult == {"fc.bias": 0.25} and mapped.wd_mult == {"fc.bias": 0.0}, \
            (mapped.lr_mult, mapped.wd_mult)
        want = torch_run(grouped, params0, grads)
        got = store_run(mapped, params0, grads, keys=[n for n, _ in named])
        err = max(close(g, w, "server_optimizer(torch %s, two groups) vs torch" % label, tol)
                  for g, w in zip(got, want))
        print("optimizers: server_optimizer(torch %s with a group of its own for the bias: lr "
              "x0.25, no decay) vs torch: max |diff| %g" % (label, err))
    m = pt.server_optimizer(t.RMSprop([torch.nn.Parameter(torch.zeros(1))], lr=0.01, alpha=0.9,
                                      momentum=0.5, centered=True))
    assert m.centered and m.gamma1 == 0.9 and m.gamma2 == 0.5, m
    # eps: torch adds it to the root, MXNet under it; the map passes eps**2.
    # On gradients of 1e-6, where torch's eps 1e-8 itself moves torch's
    # weights by about a tenth, eps**2 strays less than that; eps as it is
    # would nearly stop the steps.
    small = [[g * F32(1e-6) for g in gs] for gs in grads]
    start = [np.zeros_like(p) for p in params0]

    def rmsprop(eps):
        return lambda p: t.RMSprop(p, lr=0.01, alpha=0.9, eps=eps)

    def rel(a, b):
        return max(float(np.max(np.abs(x - y)) / np.max(np.abs(y))) for x, y in zip(a, b))
    want = torch_run(rmsprop(1e-8), start, small)
    eps_effect = rel(torch_run(rmsprop(1e-30), start, small), want)
    mapped = pt.server_optimizer(rmsprop(1e-8)([torch.nn.Parameter(torch.zeros(1))]))
    strays = rel(store_run(mapped, start, small), want)
    naive = rel(store_run(O.RMSProp(learning_rate=0.01, gamma1=0.9, epsilon=1e-8), start, small),
                want)
    print("optimizers: torch RMSprop on gradients of 1e-6: eps 1e-8 moves torch's weights by "
          "%.3g; epsilon eps**2 strays %.3g from them, epsilon eps %.3g (relative)"
          % (eps_effect, strays, naive))
    assert strays < eps_effect and naive > 0.5, (eps_effect, strays, naive)

    # Refused, naming the setting.
    p = [torch.nn.Parameter(torch.zeros(3))]
    for make, *words in [
            (lambda: t.SGD(p, lr=0.1, momentum=0.9, dampening=0.1),
             "torch.optim.SGD): dampening=0.1 cannot be mapped"),
            (lambda: t.SGD(p, lr=0.1, maximize=True), "maximize=True cannot be mapped"),
            (lambda: t.Adam(p, amsgrad=True), "amsgrad=True cannot be mapped"),
            (lambda: t.RMSprop(p, momentum=0.9), "momentum=0.9 cannot be mapped",
             "only when centered"),
            (lambda: t.Adagrad(p, weight_decay=0.01), "weight_decay=0.01 cannot be mapped",
             "outside"),
            (lambda: t.Adagrad(p, lr_decay=0.01), "lr_decay=0.01 cannot be mapped"),
            (lambda: t.Adagrad(p, initial_accumulator_value=0.1),
             "initial_accumulator_value=0.1 cannot be mapped"),
            (lambda: t.AdamW(p), "torch.optim.adamw.AdamW has no server-side equivalent"),
            (lambda: t.Adam([{"params": p}, {"params": [torch.nn.Parameter(torch.zeros(2))],
                                             "lr": 0.5}]),
             "parameter groups differ in lr: give the parameters' names"),
            (lambda: t.Adam([{"params": p}, {"params": [torch.nn.Parameter(torch.zeros(2))],
                                             "betas": (0.5, 0.9)}]),
             "parameter groups 0 and 1 differ in betas", "lr and weight_decay only"),
            (lambda: t.Adam(p, eps=0.0), "server_optimizer(torch.optim.Adam)",
             "epsilon 0 must be finite and > 0")]:
        expect_error(lambda: pt.server_optimizer(make()), ValueError, *words)
    stepped = t.Adam(p)
    p[0].grad = torch.ones(3)
    stepped.step()
    expect_error(lambda: pt.server_optimizer(stepped), ValueError, "holds state already")
    stray = torch.nn.Parameter(torch.zeros(2))
    expect_error(lambda: pt.server_optimizer(
        t.SGD([{"params": p}, {"params": [stray], "weight_decay": 0.1}], lr=0.1),
        [("w", p[0])]), ValueError, "parameter 0 of group 1 (shape (2,)) is not among the named")
    print("optimizers: server_optimizer maps torch SGD, Adam, RMSprop, Adagrad and refuses the "
          "rest ok")


# ---- dist_sync ----

def dist_rules(kv):
    """Both workers push; the servers update with the sum, as MXNet's."""
    W, r = kv.num_workers, kv.rank
    shapes = {"s": (2, 3), "big": (1200, 1200)}  # "big" is sharded over the servers
    for j, (label, opt) in enumerate(configs()):
        if opt.lr_scheduler is not None:
            continue  # the servers' clock goes on across configurations
        keys = ["%d.%s" % (j, k) for k in shapes]
        w = [np.ones(s, F32) for s in shapes.values()]
        kv.set_optimizer(opt)
        kv.init(keys, [x.copy() for x in w])
        refs = [Reference(opt.to_dict(), s) for s in shapes.values()]
        out = [np.zeros(s, F32) for s in shapes.values()]
        worst = 0.0
        for i in range(1, 5):
            every = [[np.random.default_rng((j, i, k)).standard_normal(s).astype(F32)
                      for s in shapes.values()] for k in range(W)]
            kv.pushpull(keys, every[r], out=out).wait()
            for n, shape in enumerate(shapes.values()):
                total = every[0][n].copy()
                for k in range(1, W):
                    total = total + every[k][n]
                w[n] = refs[n].step(w[n], total, opt.learning_rate)
                worst = max(worst, close(out[n], w[n], "dist_sync %s round %d key %s"
                                         % (label, i, keys[n])))
        print("optimizers: dist_sync %s vs MXNet's rule in NumPy: 4 rounds, %d workers, max "
              "|diff| %g" % (label, W, worst))
    # Per-key multipliers, "big" (sharded) included, named before its init.
    opt = pstrain.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=0.05)
    mults = {"m.s": (0.5, 0.0), "m.big": (2.0, 3.0)}
    opt.set_lr_mult({k: lr for k, (lr, _) in mults.items()})
    opt.set_wd_mult({k: wd for k, (_, wd) in mults.items()})
    kv.set_optimizer(opt)
    keys = list(mults)
    w = [np.ones(s, F32) for s in shapes.values()]
    kv.init(keys, [x.copy() for x in w])
    refs = []
    for k, s in zip(keys, shapes.values()):
        cfg, rate = scaled(opt, *mults[k])
        refs.append((Reference(cfg, s), rate))
    out = [np.zeros(s, F32) for s in shapes.values()]
    for i in range(1, 4):
        every = [[np.random.default_rng((99, i, k)).standard_normal(s).astype(F32)
                  for s in shapes.values()] for k in range(W)]
        kv.pushpull(keys, every[r], out=out).wait()
        for n, (ref, rate) in enumerate(refs):
            w[n] = ref.step(w[n], sum(every[k][n] for k in range(W)), rate(opt.learning_rate))
            close(out[n], w[n], "dist_sync multipliers round %d key %s" % (i, keys[n]))
    print("optimizers: dist_sync lr_mult and wd_mult ok")
    kv.barrier()
    print("optimizers: dist_sync rules ok")


def dist_torch_adam(kv):
    """DistributedOptimizer(server_optimizer(torch Adam)) against torch's Adam
    stepping on the workers' averaged gradients."""
    try:
        import torch
    except ImportError:
        print("optimizers: torch not installed: DistributedOptimizer case skipped")
        return
    import pstrain.torch as pt
    W, r = kv.num_workers, kv.rank

    def model():
        torch.manual_seed(7)
        return torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))

    def batch(step, k):
        g = torch.Generator().manual_seed(1000 * step + k)
        return torch.randn(8, 6, generator=g), torch.randn(8, 2, generator=g)

    def loss(m, x, y):
        return torch.nn.functional.mse_loss(m(x), y)

    ref = model()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01, weight_decay=0.01)
    net = model()
    d = pt.DistributedOptimizer(pt.server_optimizer(
        torch.optim.Adam(net.parameters(), lr=0.01, weight_decay=0.01)), net, kvstore=kv)
    group = d.param_groups[0]
    assert group["optimizer"] == "adam" and group["beta2"] == 0.999 and group["lr"] == 0.01, group
    for step in range(5):
        d.zero_grad()
        loss(net, *batch(step, r)).backward()
        d.step()
        ref_opt.zero_grad()
        grads = []
        for k in range(W):
            ref.zero_grad()
            loss(ref, *batch(step, k)).backward()
            grads.append([p.grad.clone() for p in ref.parameters()])
        for n, p in enumerate(ref.parameters()):
            p.grad = sum(g[n] for g in grads) / W
        ref_opt.step()
    d.synchronize()
    err = max(close(a.detach().numpy(), b.detach().numpy(),
                    "DistributedOptimizer(server_optimizer(torch Adam)) vs torch Adam", 1e-5)
              for a, b in zip(net.parameters(), ref.parameters()))
    d.remove_hooks()
    print("optimizers: dist_sync DistributedOptimizer(server_optimizer(torch Adam)) vs torch "
          "Adam on the averaged gradients: 5 steps, max |diff| %g" % err)

    # The same model again (its keys now prefixed), torch SGD with a group of
    # its own for the biases (a quarter of the rate, no decay) and the last
    # bias frozen: the multipliers reach the prefixed keys, the frozen
    # parameter's are left out.
    def grouped_sgd(m):
        named = list(m.named_parameters())
        m[2].bias.requires_grad_(False)
        return torch.optim.SGD(
            [{"params": [p for n, p in named if not n.endswith("bias")]},
             {"params": [p for n, p in named if n.endswith("bias")], "lr": 0.0125,
              "weight_decay": 0.0}], lr=0.05, momentum=0.9, weight_decay=0.01)
    ref = model()
    ref_opt = grouped_sgd(ref)
    net = model()
    mapped = pt.server_optimizer(grouped_sgd(net), net)
    assert mapped.lr_mult == {"0.bias": 0.25, "2.bias": 0.25}, mapped.lr_mult
    d = pt.DistributedOptimizer(mapped, net, kvstore=kv)
    assert all(k.startswith("__dist_optimizer_") for k in d._keys), d._keys
    for step in range(5):
        d.zero_grad()
        loss(net, *batch(step, r)).backward()
        d.step()
        grads = []
        for k in range(W):
            ref.zero_grad()
            loss(ref, *batch(step, k)).backward()
            grads.append([None if p.grad is None else p.grad.clone() for p in ref.parameters()])
        for n, p in enumerate(ref.parameters()):
            p.grad = None if grads[0][n] is None else sum(g[n] for g in grads) / W
        ref_opt.step()
    d.synchronize()
    err = max(close(a.detach().numpy(), b.detach().numpy(),
                    "DistributedOptimizer(server_optimizer(torch SGD, two groups)) vs torch", 1e-5)
              for a, b in zip(net.parameters(), ref.parameters()))
    d.remove_hooks()
    print("optimizers: dist_sync DistributedOptimizer(server_optimizer(torch SGD with a bias "
          "group and a frozen bias)) vs torch: 5 steps, max |diff| %g" % err)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["local", "dist_sync"], default="local")
    args = ap.parse_args()
    if args.mode == "local":
        test_classes()
        test_local_rules()
        test_multipliers()
        test_states()
        test_torch_mapping()
        print("optimizers: all ok")
        return 0
    kv = pstrain.KVStore("dist_sync")
    dist_rules(kv)
    dist_torch_adam(kv)
    kv.close()
    print("optimizers: dist_sync all ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
