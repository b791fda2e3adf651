"""Optimizers that run on the servers (MXNet's names and meanings).

``KVStore.set_optimizer`` sends one to every server, which applies it to the
pushed gradients (in dist_sync once per round, to the sum of every worker's
push). The rule, MXNet's SGD (nn/optimizer.h is the code)::

    g = rescale_grad * grad, clipped to [-clip_gradient, clip_gradient] if set
    momentum 0:  weight -= lr * (g + wd * weight)
    momentum m:  mom = m * mom - lr * (g + wd * weight);  weight += mom

``Test`` is MXNet's conformance-test optimizer: weight += rescale_grad * grad.
"""
from .lr_scheduler import LRScheduler

__all__ = ["Optimizer", "SGD", "Test", "create"]


class Optimizer:
    """Base class: learning rate, weight decay, gradient rescale and clipping."""

    type_name = None

    def __init__(self, learning_rate=0.01, wd=0.0, rescale_grad=1.0, clip_gradient=None,
                 lr_scheduler=None):
        if lr_scheduler is not None and not isinstance(lr_scheduler, LRScheduler):
            raise TypeError("lr_scheduler must be a pstrain.lr_scheduler.LRScheduler, got %r"
                            % (lr_scheduler,))
        self.learning_rate = float(learning_rate)
        self.wd = float(wd)
        self.rescale_grad = float(rescale_grad)
        self.clip_gradient = None if clip_gradient is None else float(clip_gradient)
        self.lr_scheduler = lr_scheduler
        self.wd_mult = {}

    def set_wd_mult(self, args_wd_mult):
        """Per-key multipliers of ``wd`` ({key: mult}; keys as the KVStore takes them)."""
        self.wd_mult = dict(args_wd_mult)

    def to_dict(self):
        d = {"type": self.type_name, "learning_rate": self.learning_rate, "wd": self.wd,
             "rescale_grad": self.rescale_grad, "clip_gradient": self.clip_gradient}
        if self.lr_scheduler is not None:
            d["lr_scheduler"] = self.lr_scheduler.to_dict()
        return d

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__,
                           ", ".join("%s=%r" % kv for kv in sorted(self.to_dict().items())
                                     if kv[0] != "type"))


class SGD(Optimizer):
    """Momentum SGD with weight decay (MXNet's ``sgd``)."""

    type_name = "sgd"

    def __init__(self, learning_rate=0.01, momentum=0.0, **kwargs):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.momentum = float(momentum)

    def to_dict(self):
        d = super().to_dict()
        d["momentum"] = self.momentum
        return d


class Test(Optimizer):
    """weight += rescale_grad * grad (MXNet's ``test``, for conformance checks)."""

    type_name = "test"


_REGISTRY = {"sgd": SGD, "test": Test}


def create(name, **kwargs):
    """An optimizer by MXNet's name ("sgd", "test") with its keyword arguments."""
    try:
        cls = _REGISTRY[name.lower()]
    except KeyError:
        raise ValueError("unknown optimizer %r (known: %s)" % (name, ", ".join(sorted(_REGISTRY))))
    return cls(**kwargs)
