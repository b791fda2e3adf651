"""Learning-rate schedules the servers apply (MXNet's names and meanings).

The schedule counts updates as MXNet does: the largest number of updates any
key has had. It runs where the optimizer runs (on the servers in dist modes).
"""

__all__ = ["LRScheduler", "FactorScheduler", "MultiFactorScheduler"]


class LRScheduler:
    """Base class: a schedule of the optimizer's learning rate."""

    def to_dict(self):
        raise NotImplementedError


class FactorScheduler(LRScheduler):
    """lr *= factor every ``step`` updates, never below ``stop_factor_lr``."""

    def __init__(self, step, factor=1.0, stop_factor_lr=1e-8):
        if step < 1:
            raise ValueError("FactorScheduler: step must be at least 1, got %r" % (step,))
        if not 0.0 < factor <= 1.0:
            raise ValueError("FactorScheduler: factor must be in (0, 1], got %r" % (factor,))
        self.step = int(step)
        self.factor = float(factor)
        self.stop_factor_lr = float(stop_factor_lr)

    def to_dict(self):
        return {"type": "factor", "step": self.step, "factor": self.factor,
                "stop_factor_lr": self.stop_factor_lr}


class MultiFactorScheduler(LRScheduler):
    """lr *= factor when the update count passes each of ``step`` (increasing)."""

    def __init__(self, step, factor=1.0):
        step = [int(s) for s in step]
        if not step or any(s < 1 for s in step) or any(b <= a for a, b in zip(step, step[1:])):
            raise ValueError("MultiFactorScheduler: step must be increasing positive update "
                             "counts, got %r" % (step,))
        if not 0.0 < factor <= 1.0:
            raise ValueError("MultiFactorScheduler: factor must be in (0, 1], got %r" % (factor,))
        self.step = step
        self.factor = float(factor)

    def to_dict(self):
        return {"type": "multifactor", "step": list(self.step), "factor": self.factor}
