"""Optimizers that run on the servers (MXNet 1.x's names, defaults and rules).

``KVStore.set_optimizer`` sends one to every server, which applies it to the
pushed gradients (in dist_sync once per round, to the sum of every worker's
push); a ``local`` store applies it in this process. nn/optimizer.h is the
code; in brief, with ``g = rescale_grad * grad`` and ``clip(x)`` x clipped to
[-clip_gradient, clip_gradient] when clip_gradient is set::

    SGD      momentum 0:  w -= lr * (clip(g) + wd * w)
             momentum m:  mom = m * mom - lr * (clip(g) + wd * w);  w += mom
    NAG      s = lr * (clip(g) + wd * w);  mom = m * mom - s;  w += m * mom - s
             (MXNet 1.6+'s nag_mom_update; momentum 0: SGD's rule)
    Adam     h = clip(g + wd * w);  mean = beta1 * mean + (1 - beta1) * h
             var = beta2 * var + (1 - beta2) * h**2
             w -= lr * sqrt(1 - beta2**t) / (1 - beta1**t) * mean / (sqrt(var) + epsilon)
             (t: the key's update count, this one included)
    RMSProp  h = clip(g + wd * w);  n = (1 - gamma1) * h**2 + gamma1 * n
             w -= lr * h / sqrt(n + epsilon)
      centered: n as above;  mg = (1 - gamma1) * h + gamma1 * mg
             delta = gamma2 * delta - lr * h / sqrt(n - mg**2 + epsilon);  w += delta
             (both: w clipped to [-clip_weights, clip_weights] when that is set)
    AdaGrad  h = clip(g);  history += h**2;  w -= lr * (h / sqrt(history + eps) + wd * w)
    Test     w += g  (MXNet's conformance-test optimizer)

Each key's state (its "slots") starts at zero: SGD and NAG with momentum keep
``momentum``, Adam ``mean`` and ``var``, RMSProp ``n`` (centered: ``n``,
``g``, ``delta``), AdaGrad ``history``. A bad setting raises ValueError when
the optimizer is made (the servers' own check); one changed afterwards raises
``pstrain.Error`` at ``set_optimizer``.
"""
import math

from . import _pstrain
from .lr_scheduler import LRScheduler

__all__ = ["Optimizer", "SGD", "NAG", "Adam", "RMSProp", "AdaGrad", "Test", "create"]


def _number(owner, name, value):
    """float(value), or a TypeError naming the setting."""
    if isinstance(value, bool):
        raise TypeError("%s: %s must be a number, got %r" % (owner, name, value))
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError("%s: %s must be a number, got %r" % (owner, name, value)) from None


def _optional_number(owner, name, value):
    """None (off), or a number that is not NaN."""
    if value is None:
        return None
    v = _number(owner, name, value)
    if math.isnan(v):
        raise ValueError("%s: %s is NaN (None turns it off)" % (owner, name))
    return v


def _multipliers(owner, what, mults):
    """{key: float} from a dict of finite numbers keyed by str or int; the
    errors name ``owner`` and ``what`` (lr_mult, wd_mult)."""
    if not isinstance(mults, dict):
        raise TypeError("%s: %s takes a dict {key: multiplier}, got %r" % (owner, what, mults))
    out = {}
    for key, m in mults.items():
        if isinstance(key, bool) or not isinstance(key, (str, int)):
            raise TypeError("%s: %s key %r is not a KVStore key (str or int)" % (owner, what, key))
        v = _number(owner, "%s[%r]" % (what, key), m)
        if not math.isfinite(v):
            raise ValueError("%s: %s[%r] is %r: a multiplier must be finite" % (owner, what, key, v))
        out[key] = v
    return out


class Optimizer:
    """Base class: learning rate, weight decay, gradient rescale and clipping.

    A subclass sets its own settings before calling this constructor, which
    checks them all.
    """

    type_name = None

    def __init__(self, learning_rate=0.01, wd=0.0, rescale_grad=1.0, clip_gradient=None,
                 lr_scheduler=None):
        name = type(self).__name__
        if lr_scheduler is not None and not isinstance(lr_scheduler, LRScheduler):
            raise TypeError("lr_scheduler must be a pstrain.lr_scheduler.LRScheduler, got %r"
                            % (lr_scheduler,))
        self.learning_rate = _number(name, "learning_rate", learning_rate)
        self.wd = _number(name, "wd", wd)
        self.rescale_grad = _number(name, "rescale_grad", rescale_grad)
        self.clip_gradient = _optional_number(name, "clip_gradient", clip_gradient)
        self.lr_scheduler = lr_scheduler
        self.lr_mult = {}
        self.wd_mult = {}
        if self.type_name is not None:
            self._slot_names()

    def set_lr_mult(self, args_lr_mult):
        """Per-key multipliers of the learning rate ({key: mult}; keys as the
        KVStore takes them, names or integers; a key not named: 1), MXNet's
        ``Optimizer.set_lr_mult``. The rate a key's update uses is the
        schedule's times its multiplier."""
        self.lr_mult = _multipliers(type(self).__name__, "lr_mult", args_lr_mult)

    def set_wd_mult(self, args_wd_mult):
        """Per-key multipliers of ``wd`` ({key: mult}; keys as the KVStore takes
        them; a key not named: 1), MXNet's ``Optimizer.set_wd_mult``."""
        self.wd_mult = _multipliers(type(self).__name__, "wd_mult", args_wd_mult)

    def to_dict(self):
        """The settings as the C++ side reads them (python/pstrain_module.cc)."""
        d = {"type": self.type_name, "learning_rate": self.learning_rate, "wd": self.wd,
             "rescale_grad": self.rescale_grad, "clip_gradient": self.clip_gradient}
        if self.lr_scheduler is not None:
            d["lr_scheduler"] = self.lr_scheduler.to_dict()
        return d

    def _slot_names(self):
        """The names of the arrays each key's state holds, in order; ValueError
        for a setting the servers refuse."""
        try:
            return _pstrain.optimizer_slots(self.to_dict())
        except (_pstrain.Error, ValueError) as e:
            why = str(e)
            for prefix in ("InvalidArgument: ", "%s: " % self.type_name):
                if why.startswith(prefix):
                    why = why[len(prefix):]
            raise ValueError("%s: %s" % (type(self).__name__, why)) from None

    # Constructor names of to_dict's keys where they differ (repr).
    _arg_names = {}

    def __repr__(self):
        items = [(self._arg_names.get(k, k), v) for k, v in self.to_dict().items() if k != "type"]
        return "%s(%s)" % (type(self).__name__, ", ".join("%s=%r" % kv for kv in sorted(items)))


class _WithMomentum(Optimizer):
    """The settings of SGD and NAG: the base's and a momentum."""

    def __init__(self, learning_rate=0.01, momentum=0.0, **kwargs):
        self.momentum = _number(type(self).__name__, "momentum", momentum)
        super().__init__(learning_rate=learning_rate, **kwargs)

    def to_dict(self):
        d = super().to_dict()
        d["momentum"] = self.momentum
        return d


class SGD(_WithMomentum):
    """Momentum SGD with weight decay (MXNet's ``sgd``)."""

    type_name = "sgd"


class NAG(_WithMomentum):
    """Nesterov accelerated SGD (MXNet's ``nag``): SGD's settings, Nesterov's
    momentum step (the module's documentation has the rule)."""

    type_name = "nag"


class Adam(Optimizer):
    """Adam (MXNet's ``adam``), its bias correction folded into the rate."""

    type_name = "adam"

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, **kwargs):
        name = type(self).__name__
        self.beta1 = _number(name, "beta1", beta1)
        self.beta2 = _number(name, "beta2", beta2)
        self.epsilon = _number(name, "epsilon", epsilon)
        super().__init__(learning_rate=learning_rate, **kwargs)

    def to_dict(self):
        d = super().to_dict()
        d.update(beta1=self.beta1, beta2=self.beta2, epsilon=self.epsilon)
        return d


class RMSProp(Optimizer):
    """RMSProp (MXNet's ``rmsprop``): Tieleman & Hinton's, or with
    ``centered=True`` Graves' (``gamma2`` is its momentum). ``clip_weights``
    clips the weights after each update (None: off)."""

    type_name = "rmsprop"

    def __init__(self, learning_rate=0.001, gamma1=0.9, gamma2=0.9, epsilon=1e-8,
                 centered=False, clip_weights=None, **kwargs):
        name = type(self).__name__
        self.gamma1 = _number(name, "gamma1", gamma1)
        self.gamma2 = _number(name, "gamma2", gamma2)
        self.epsilon = _number(name, "epsilon", epsilon)
        if not isinstance(centered, bool):
            raise TypeError("%s: centered must be True or False, got %r" % (name, centered))
        self.centered = centered
        self.clip_weights = _optional_number(name, "clip_weights", clip_weights)
        super().__init__(learning_rate=learning_rate, **kwargs)

    def to_dict(self):
        d = super().to_dict()
        d.update(gamma1=self.gamma1, gamma2=self.gamma2, epsilon=self.epsilon,
                 centered=self.centered, clip_weights=self.clip_weights)
        return d


class AdaGrad(Optimizer):
    """AdaGrad (MXNet's ``adagrad``); ``eps`` is added to the history under the
    square root. Weight decay is applied outside the adaptive term."""

    type_name = "adagrad"
    _arg_names = {"epsilon": "eps"}

    def __init__(self, eps=1e-7, **kwargs):
        self.eps = _number(type(self).__name__, "eps", eps)
        super().__init__(**kwargs)

    def to_dict(self):
        d = super().to_dict()
        d["epsilon"] = self.eps
        return d


class Test(Optimizer):
    """weight += rescale_grad * grad (MXNet's ``test``, for conformance checks)."""

    type_name = "test"


_REGISTRY = {c.type_name: c for c in (SGD, NAG, Adam, RMSProp, AdaGrad, Test)}


def create(name, **kwargs):
    """An optimizer by MXNet's name ("sgd", "nag", "adam", "rmsprop", "adagrad",
    "test"; any case) with its keyword arguments."""
    try:
        cls = _REGISTRY[name.lower()]
    except (KeyError, AttributeError):
        raise ValueError("unknown optimizer %r (known: %s)" % (name, ", ".join(sorted(_REGISTRY))))
    return cls(**kwargs)
