"""pstrain.torch: train a PyTorch model through pstrain's parameter servers.

``DistributedOptimizer`` exchanges each parameter's gradient the moment
autograd produces it (a tensor hook issues one non-blocking ``pushpull``,
priority -i for parameter i, so the parameters the next forward needs first
leave first) and waits for a parameter's new value only when it is needed:

* with ``module=`` (or the model given instead of its named parameters),
  just before the forward of the module that owns it (a forward pre-hook).
  A module's forward may read any parameter below it (a tied weight, a
  child's weight used through ``F.linear``), so a module's hook waits for
  every parameter of its subtree; only ``nn.Sequential`` (its own forward,
  which calls each child in turn) is waited through, child by child. A
  model that is an ``nn.Sequential`` of layers thus has the last exchanges
  of a step hide behind the next step's first layers; any other model waits
  for all its parameters when its forward starts. Parameters outside
  ``module`` are waited for in ``step()``;
* otherwise in ``step()``.

Two ways to update, chosen by the optimizer given:

* server-side (a ``pstrain.optimizer`` such as ``pstrain.optimizer.SGD`` or
  ``pstrain.optimizer.Adam``; ``server_optimizer`` makes one from a
  ``torch.optim`` optimizer where the arithmetic matches): the servers apply
  it (in dist_sync once per round to the sum of every worker's gradient) and
  each pushpull returns the new weights straight into the parameter's
  memory. Works in dist_sync and dist_async. Its state (momentum, Adam's
  moments, ...) lives on the servers.
* local (a ``torch.optim.Optimizer``): the servers only sum (dist_sync), the
  summed gradient comes back into a buffer and ``step()`` hands it, rescaled,
  to the wrapped optimizer, which updates every worker's copy alike.

The servers run one optimizer for every key, so a store serves one
server-side ``DistributedOptimizer`` at a time (wrap every parameter in one),
and local ones only while the servers run none: a second one that would
change what the servers do for the first raises ``pstrain.Error``
(FailedPrecondition) until the first's ``remove_hooks()``.

Parameters autograd gave no gradient in a step (unused, or ``p.grad`` None)
still push zeros: a dist_sync round needs every worker's push. In local mode
a parameter no worker gave a gradient keeps ``p.grad`` None, so the wrapped
optimizer skips it as it would alone (no weight decay, no momentum step).
The servers' optimizer updates every key pushed, as MXNet's does: it applies
weight decay and its state (momentum, Adam's moments) to such a parameter
with a zero gradient. Keep a
parameter out of training with ``requires_grad=False`` (before the
constructor), which leaves it out of the exchange.

Gradient rescale, as MXNet's: the servers' optimizer gets ``rescale_grad``
times 1/(batch_size * num_workers) in dist_sync and 1/batch_size in
dist_async (local mode: the summed gradient is multiplied by the same). With
PyTorch's usual mean-reduced loss leave ``batch_size=1``: dist_sync then
averages the workers' gradients. With a summed loss pass the per-worker batch.

Every worker starts from worker rank 0's weights (the constructor broadcasts
them). One backward per step. A parameter's new value is written into it once
autograd has produced its whole gradient, when every backward step that reads
it has run (tied weights included), unless the forward also read it outside
autograd (``p.detach()``, ``p.data``): a backward step may then read the new
value. The
gradient pushed is the tensor autograd produced (not copied); ``p.grad`` gets its
own copy, so changing ``p.grad`` in place (clipping) does not change what is
sent: clip on the servers (``clip_gradient``) instead.
"""
import copy
import json
import math
import os
import re
import time
import types

import torch

from . import optimizer as _server
from ._pstrain import Error
from .kvstore import _OPEN, KVStore
from .optimizer import Optimizer as ServerOptimizer

__all__ = ["Average", "DistributedOptimizer", "Sum", "allgather", "allreduce", "allreduce_",
           "allreduce_async", "poll", "synchronize",
           "broadcast", "broadcast_", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "init",
           "local_rank", "local_size", "rank", "server_optimizer", "size"]

# Horovod's reduction ops for allreduce.
Average = "average"
Sum = "sum"


def _store(kvstore):
    if kvstore is not None:
        return kvstore
    return _open_store() or KVStore("dist_sync")


def _open_store():
    """This process's open store, or None."""
    return next((s for s in _OPEN if not s._closed), None)


def init(kvstore_type="dist_sync"):
    """Horovod's ``init``: joins the job as this worker, opening its store (a
    dist KVStore of ``kvstore_type``) unless one is open; returns the store.
    The other functions of this module use it. Under ``pstrain launch`` only.
    """
    s = _open_store()
    if s is None:
        return KVStore(kvstore_type)
    if s.type != kvstore_type:
        raise ValueError("init(%r): this process's store is already a %r one"
                         % (kvstore_type, s.type))
    return s


def rank():
    """This worker's rank, 0 .. size() - 1 (Horovod's ``rank``; opens the
    store as ``init()`` does)."""
    return _store(None).rank


def size():
    """The number of workers in the job (Horovod's ``size``)."""
    return _store(None).num_workers


def _local(name):
    value = os.environ.get(name)
    if value is None:
        raise Error("FailedPrecondition: %s is not set: `pstrain launch` sets it for its "
                    "local, ssh and slurm launchers; under mpi, OMPI_COMM_WORLD_LOCAL_RANK (or "
                    "MPICH's MPI_LOCALRANKID) is there, but it counts a host's servers too"
                    % name)
    return int(value)


def local_rank():
    """This worker's rank among the workers of its host, 0 .. local_size() - 1
    (Horovod's ``local_rank``: the GPU to take, ``torch.cuda.set_device(
    local_rank())``). From ``PSTRAIN_LOCAL_RANK``, which ``pstrain launch``
    sets for its local, ssh and slurm launchers (servers are not counted)."""
    return _local("PSTRAIN_LOCAL_RANK")


def local_size():
    """The number of workers on this host (Horovod's ``local_size``), from
    ``PSTRAIN_LOCAL_SIZE`` (see ``local_rank``)."""
    return _local("PSTRAIN_LOCAL_SIZE")


def _named(params):
    if isinstance(params, torch.nn.Module):
        return list(params.named_parameters())
    if isinstance(params, dict):
        return list(params.items())
    out = list(params)
    for item in out:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise TypeError("expected (name, tensor) pairs such as model.named_parameters(), "
                            "got %r" % (item,))
    return out


def broadcast_parameters(params, root_rank=0, kvstore=None):
    """Copies worker ``root_rank``'s tensors into every worker's (in place). Blocks.

    ``params``: a ``state_dict()`` or ``named_parameters()`` (or a module);
    every worker passes the same names in the same order. Buffers that are
    not float32 (BatchNorm's counter) travel as float32. Only rank 0 can be
    the root (its values are the ones ``KVStore.init`` keeps). Called again
    (after loading a checkpoint on rank 0, say), tensors of names an earlier
    call broadcast replace their values on the servers, which hold one copy
    of each however often it runs (a key per name and size: another model
    with the same names gets keys of its own). A worker whose names or
    sizes are not worker 0's raises ValueError saying which. It changes the
    tensors only: a server-side ``DistributedOptimizer`` keeps its weights
    and state on the servers and writes them back at its next step, so load
    a checkpoint before making it (its constructor broadcasts rank 0's
    weights). Its keys are strings: a store with int keys refuses it.
    """
    if root_rank != 0:
        raise ValueError("broadcast_parameters: only root_rank=0 is supported (got %r)"
                         % (root_rank,))
    kv = _store(kvstore)
    named = list(_named(params))
    if not named:
        return
    # Rank 0's names and sizes first: the keys follow them, a key per name
    # and size (a generation of the name per size seen, the same on every
    # worker, so models that take turns reuse theirs), and a worker whose
    # tensors are not rank 0's says so instead of reading another key.
    mine = [[n, t.numel()] for n, t in named]
    theirs = json.loads(bytes(kv._broadcast_bytes(
        "__broadcast__/manifest", json.dumps(mine).encode() if kv.rank == 0 else b"")).decode())
    if theirs != mine:
        diff = next((i for i, (a, b) in enumerate(zip(theirs, mine)) if a != b),
                    min(len(theirs), len(mine)))
        raise ValueError("broadcast_parameters: worker %d's tensors are not worker 0's: %s "
                         "against worker 0's %s (%d tensors against %d)"
                         % (kv.rank, mine[diff] if diff < len(mine) else "none",
                            theirs[diff] if diff < len(theirs) else "none",
                            len(mine), len(theirs)))
    generations = kv.__dict__.setdefault("_broadcast_generations", {})
    keys, tensors = [], []
    for n, t in named:
        if t.numel() == 0:
            continue
        by_size = generations.setdefault(n, {})
        gen = by_size.setdefault(t.numel(), len(by_size))
        keys.append("__broadcast__/%d/%s" % (gen, n))
        tensors.append(t)
    if keys:
        kv._rebroadcast(keys, tensors)


def _pack(obj):
    """``obj`` as bytes: a JSON text of its structure (dicts with their keys'
    kinds, lists, tuples, numbers, strings, None), then the raw bytes of its
    tensors. No pickle: reading it back runs no code of the sender's."""
    tensors = []

    def enc(x):
        if isinstance(x, torch.Tensor):
            if x.is_quantized or x.layout != torch.strided:
                raise TypeError("a %s tensor (only dense tensors travel)"
                                % ("quantized" if x.is_quantized else str(x.layout)))
            t = x.detach().to("cpu").resolve_conj().resolve_neg().contiguous()
            tensors.append(t.reshape(-1).view(torch.uint8).numpy().tobytes())
            return {"t": [str(t.dtype).replace("torch.", ""), list(t.shape)]}
        if x is None or isinstance(x, (bool, int, float, str)):
            return {"v": x}
        if isinstance(x, dict):
            return {"d": [[enc(k), enc(v)] for k, v in x.items()]}
        if isinstance(x, (list, tuple)):
            return {"l" if isinstance(x, list) else "u": [enc(v) for v in x]}
        raise TypeError("a %s (only tensors, numbers, strings, None and lists, tuples and "
                        "dicts of them travel)" % type(x).__name__)

    try:
        # ValueError: an int json will not write; RecursionError (a
        # RuntimeError): nesting too deep; RuntimeError: a tensor with no
        # plain layout. Every worker then raises, not rank 0 alone.
        text = json.dumps({"obj": enc(obj)}).encode()
    except (TypeError, ValueError, RuntimeError) as e:
        text, tensors = json.dumps({"error": "%s: %s" % (type(e).__name__, e)}).encode(), []
    return b"".join([len(text).to_bytes(8, "little"), text] + tensors)


def _unpack(data, header_only=False):
    """What ``_pack`` made, back (an error it recorded raised as ValueError;
    ``header_only``: only that)."""
    if not isinstance(data, memoryview) or data.readonly:
        data = memoryview(bytearray(data))  # torch.frombuffer wants a writable buffer
    size = int.from_bytes(data[:8], "little")
    head = json.loads(bytes(data[8:8 + size]).decode())
    if "error" in head:
        raise ValueError("broadcast_object: worker 0's object cannot travel: " + head["error"])
    if header_only:
        return None
    at = [8 + size]

    def dec(x):
        if "v" in x:
            return x["v"]
        if "t" in x:
            dtype, shape = getattr(torch, x["t"][0], None), x["t"][1]
            if not isinstance(dtype, torch.dtype):
                raise ValueError("broadcast_object: unknown tensor dtype %r" % (x["t"][0],))
            t = torch.empty(shape, dtype=dtype)
            n = t.numel() * t.element_size()
            if n:
                raw = torch.frombuffer(data[at[0]:at[0] + n], dtype=torch.uint8)
                t.reshape(-1).view(torch.uint8).copy_(raw)
            at[0] += n
            return t
        if "d" in x:
            return {dec(k): dec(v) for k, v in x["d"]}
        items = [dec(v) for v in x.get("l", x.get("u"))]
        return items if "l" in x else tuple(items)

    return dec(head["obj"])


def broadcast_object(obj, root_rank=0, name=None, kvstore=None):
    """Worker ``root_rank``'s ``obj``, returned on every worker (Horovod's
    ``broadcast_object``, for plain data). Blocks.

    ``obj``: tensors (any dtype, dense and not quantized; they arrive on the
    CPU, each its own copy), numbers, strings, ``None``, and lists, tuples
    and dicts of them, such as an optimizer's ``state_dict()``. Subclasses
    arrive as these (an ``OrderedDict`` as a dict, a namedtuple as a tuple,
    a ``Parameter`` as a tensor); rank 0 gets its own ``obj`` back, as in
    Horovod. It travels as a structure and raw tensor bytes, not pickled, so
    receiving it runs no code; anything else raises ValueError on every
    worker. Every worker calls it, with the same ``name`` if several objects
    are broadcast (default: one name for all). The servers keep a copy per
    name and power-of-two size class, so repeated calls add no keys. Its
    keys are strings: a store with int keys refuses it. Only rank 0 can be
    the root.
    """
    if root_rank != 0:
        raise ValueError("broadcast_object: only root_rank=0 is supported (got %r)"
                         % (root_rank,))
    kv = _store(kvstore)
    data = _pack(obj) if kv.rank == 0 else b""
    data = kv._broadcast_bytes("__object__/%s" % ("" if name is None else name), data)
    # Raises on every worker for an object that could not travel.
    got = _unpack(data, header_only=kv.rank == 0)
    return obj if kv.rank == 0 else got


def allreduce(tensor, average=None, name=None, op=None, kvstore=None):
    """Horovod's ``allreduce``: every worker's ``tensor`` summed
    (``op=pstrain.torch.Sum``) or averaged (``Average``, the default; or
    ``average=True/False``, Horovod's older form), as a new tensor of
    ``tensor``'s shape, dtype and device. Blocks. For metrics and other
    values outside the model (a validation loss, say), next to a
    ``DistributedOptimizer``: the servers sum it whatever optimizer they run.

    Every worker calls it in the same order. ``name`` keys the exchange (each
    name keeps one element count); without one, tensors of one element count
    share a key, which is safe as calls are matched in order. Each name is a
    key on the servers for good, and its first call passes a barrier: name
    what recurs, not each step. dist_sync only, in a store of string keys (as
    the DistributedOptimizer's); a local store (one worker) returns a copy.
    The sum is formed in float32 (integers exact up to 2**24; an integer
    average truncates, as Horovod's) and, as Horovod's, carries NaN and Inf
    through. With ``PSTRAIN_WORKER_LOSS=continue``, after a worker is lost the
    sum covers the workers left and ``Average`` still divides by the job's
    worker count. The result is not part of autograd's graph.
    """
    return synchronize(allreduce_async(tensor, average=average, name=name, op=op,
                                       kvstore=kvstore))


class AllreduceHandle:
    """An allreduce in flight (``allreduce_async``): ``synchronize`` or
    ``poll`` it."""

    def __init__(self, tensor, handle, out, divide_by):
        self._tensor, self._handle, self._out, self._divide_by = tensor, handle, out, divide_by
        self._result = None

    def _done(self):
        return self._result is not None or self._handle is None or self._handle.done()

    def _wait(self):
        if self._result is None:
            if self._handle is not None:
                self._handle.wait()
            summed = torch.from_numpy(self._out)
            if self._divide_by != 1:
                summed /= self._divide_by
            t = self._tensor
            self._result = summed.reshape(t.shape).to(dtype=t.dtype, device=t.device)
        return self._result


def allreduce_async(tensor, average=None, name=None, op=None, kvstore=None):
    """Horovod's ``allreduce_async``: starts ``allreduce`` and returns an
    ``AllreduceHandle`` at once (the first call of a name still passes its
    key's barrier). ``synchronize(handle)`` returns the result, ``poll`` says
    whether it is there. ``tensor`` is copied before this returns. Several may
    be in flight; every worker starts them in the same order."""
    if op is None:
        op = Average if average is None or average else Sum
    elif average is not None:
        raise ValueError("allreduce: give op or average, not both")
    if op not in (Average, Sum):
        raise ValueError("allreduce: op must be pstrain.torch.Average or Sum, got %r" % (op,))
    _check_tensor("allreduce", tensor)
    if tensor.numel() == 0:  # nothing to exchange
        return AllreduceHandle(tensor, None, torch.zeros(0).numpy(), 1)
    kv = _store(kvstore)
    key = "__allreduce__/%s" % (name if name is not None else "numel-%d" % tensor.numel())
    # Flat (a key keeps its element count, not one shape), and a copy of its
    # own: the caller may change the tensor while the exchange is in flight.
    flat = tensor.detach().to(device="cpu", dtype=torch.float32, copy=True).reshape(-1)
    handle, out = kv._allreduce_async(key, flat)
    return AllreduceHandle(tensor, handle, out, kv.num_workers if op == Average else 1)


def synchronize(handle):
    """Horovod's ``synchronize``: waits for an ``allreduce_async`` and returns
    its result (raises pstrain.Error if it failed)."""
    if not isinstance(handle, AllreduceHandle):
        raise TypeError("synchronize takes what allreduce_async returned, got %r" % (handle,))
    return handle._wait()


def poll(handle):
    """Horovod's ``poll``: whether ``synchronize(handle)`` would return at once."""
    if not isinstance(handle, AllreduceHandle):
        raise TypeError("poll takes what allreduce_async returned, got %r" % (handle,))
    return handle._done()


def allreduce_(tensor, average=None, name=None, op=None, kvstore=None):
    """``allreduce`` into ``tensor`` itself (Horovod's in-place form); returns it."""
    with torch.no_grad():
        tensor.copy_(allreduce(tensor, average=average, name=name, op=op, kvstore=kvstore))
    return tensor


def _check_tensor(what, tensor):
    """TypeError naming ``what`` unless ``tensor`` is a real-valued torch.Tensor."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("%s takes a torch.Tensor, got %r" % (what, type(tensor).__name__))
    if tensor.is_complex():
        raise TypeError("%s: complex tensors are not supported (%s)" % (what, tensor.dtype))


def _summed(tensor, key, kvstore):
    """Every worker's float32 ``tensor`` (flat) summed over the servers under
    ``key`` (``__allreduce__/`` + key), as a float32 CPU tensor."""
    kv = _store(kvstore)
    return torch.from_numpy(kv._allreduce("__allreduce__/" + key, tensor.reshape(-1))), kv


def broadcast(tensor, root_rank, name=None, kvstore=None):
    """Horovod's ``broadcast``: worker ``root_rank``'s ``tensor`` on every
    worker, as a new tensor (any rank may be the root). Every worker passes a
    tensor of the same shape. An allreduce in which the other workers give
    zeros: exact (x + 0), but for the sign of a zero (integers: up to 2**24).
    Blocks."""
    _check_tensor("broadcast", tensor)
    kv = _store(kvstore)
    if not 0 <= root_rank < kv.num_workers:
        raise ValueError("broadcast: root_rank %r is not in [0, %d)" % (root_rank, kv.num_workers))
    if tensor.numel() == 0:
        return tensor.detach().clone()
    mine = tensor.detach().to(device="cpu", dtype=torch.float32)
    if kv.rank != root_rank:
        mine = torch.zeros_like(mine)
    got, _ = _summed(mine, name if name is not None else "numel-%d" % tensor.numel(), kv)
    return got.reshape(tensor.shape).to(dtype=tensor.dtype, device=tensor.device)


def broadcast_(tensor, root_rank, name=None, kvstore=None):
    """``broadcast`` into ``tensor`` itself (Horovod's in-place form); returns it."""
    with torch.no_grad():
        tensor.copy_(broadcast(tensor, root_rank, name=name, kvstore=kvstore))
    return tensor


def allgather(tensor, name=None, kvstore=None):
    """Horovod's ``allgather``: every worker's ``tensor`` concatenated along
    its first dimension in rank order, as a new tensor. The first dimension
    may differ between workers, the others may not (ValueError on every
    worker, naming the shapes). Two allreduces: the workers' row counts, then
    a buffer of every row in which each worker fills its own (the others add
    zeros: exact, but for the sign of a zero; the servers move W times the
    data; each total size is a key for good). Integers exact up to 2**24.
    Blocks."""
    _check_tensor("allgather", tensor)
    if tensor.dim() == 0:
        raise ValueError("allgather: a 0-d tensor has no first dimension to concatenate")
    kv = _store(kvstore)
    W, r = kv.num_workers, kv.rank
    rows, row = tensor.shape[0], math.prod(tensor.shape[1:])
    base = "allgather/%s" % (name if name is not None else "unnamed")
    # Each worker's row count, row size and number of dimensions at its rank.
    sizes = torch.zeros(3 * W, dtype=torch.float32)
    sizes[r], sizes[W + r] = rows, row
    sizes[2 * W + r] = tensor.dim()
    sizes, _ = _summed(sizes, base + "/sizes", kv)
    counts = [int(c) for c in sizes[:W]]
    known = {int(x) for x in sizes[W:2 * W]}
    ranks = {int(x) for x in sizes[2 * W:]}
    if len(known) > 1 or len(ranks) > 1:
        raise ValueError("allgather: the workers' tensors differ beyond the first dimension "
                         "(rows of %s elements, %s dimensions); this worker's shape is %s"
                         % (sorted(known), sorted(ranks), tuple(tensor.shape)))
    total = sum(counts)
    shape = (total,) + tuple(tensor.shape[1:])
    if total == 0:
        return torch.zeros(shape, dtype=tensor.dtype, device=tensor.device)
    buffer = torch.zeros(shape, dtype=torch.float32)
    start = sum(counts[:r])
    buffer[start:start + rows] = tensor.detach().to(device="cpu", dtype=torch.float32)
    got, _ = _summed(buffer, "%s/rows-%d" % (base, buffer.numel()), kv)
    return got.reshape(shape).to(dtype=tensor.dtype, device=tensor.device)


def broadcast_optimizer_state(optimizer, root_rank=0, kvstore=None):
    """Loads worker ``root_rank``'s optimizer state into every worker's
    optimizer (Horovod's ``broadcast_optimizer_state``): after rank 0 loaded a
    checkpoint, say. Blocks.

    ``optimizer``: a ``torch.optim.Optimizer``, or a ``DistributedOptimizer``
    (its local one; a server-side optimizer's state lives on the servers, and
    there is nothing to do). Its hyper-parameters (``param_groups``) come too.
    Every worker calls it. Only rank 0 can be the root. A worker whose
    optimizer cannot take rank 0's state (other parameter groups) raises
    there, after the exchange, as ``load_state_dict`` does.
    """
    if root_rank != 0:
        raise ValueError("broadcast_optimizer_state: only root_rank=0 is supported (got %r)"
                         % (root_rank,))
    if isinstance(optimizer, DistributedOptimizer):
        if optimizer._server_side:
            return
        kvstore = optimizer.kvstore if kvstore is None else kvstore
        optimizer = optimizer._optimizer
    if isinstance(optimizer, ServerOptimizer):
        return
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("broadcast_optimizer_state takes a torch.optim.Optimizer or a "
                        "DistributedOptimizer, got %r" % (optimizer,))
    kv = _store(kvstore)
    state = broadcast_object(optimizer.state_dict(), name="__optimizer_state__", kvstore=kv)
    if kv.rank != 0:
        optimizer.load_state_dict(state)


def server_optimizer(optimizer, named_parameters=None):
    """The ``pstrain.optimizer`` that does on the servers what the
    ``torch.optim`` optimizer ``optimizer`` does here, from its current
    settings (taken once: a torch lr scheduler stepping it later does not
    reach the servers; use a ``pstrain.lr_scheduler``). For
    ``DistributedOptimizer``, whose ``batch_size`` sets the rescale.

    Parameter groups may differ in ``lr`` and ``weight_decay`` (biases and
    norms without decay, say): the servers' optimizer takes the largest of
    each and every parameter of a group with less gets that ratio as its
    ``lr_mult`` / ``wd_mult`` (MXNet's per-key multipliers), keyed by its
    name, so ``named_parameters`` (the model, or ``model.named_parameters()``)
    is then needed. A ratio is exact where it is a power of two or 0, else
    to float32 rounding of the rate (lr * lr_mult, one rounding more).

    Mapped, torch setting by setting (the rules are in pstrain.optimizer):

    * ``SGD``: lr, momentum, weight_decay -> ``SGD`` (MXNet keeps the momentum
      times -lr: the same steps while lr stays); ``nesterov=True`` ->
      ``NAG`` (its momentum too is kept times -lr: the same steps while lr
      stays). Refused:
      ``dampening`` with momentum.
    * ``Adam``: lr, betas -> beta1, beta2, eps -> epsilon, weight_decay (both
      add wd * w to the gradient) -> ``Adam``. One difference: torch adds eps
      to sqrt(var) / sqrt(1 - beta2**t), MXNet to sqrt(var), so MXNet's eps
      weighs 1 / sqrt(1 - beta2**t) times more (31.6 at the first step with
      beta2 0.999, 1 in the long run). Refused: ``amsgrad``.
    * ``RMSprop``: lr, alpha -> gamma1, weight_decay, centered -> ``RMSProp``;
      with ``centered``, momentum -> gamma2 (Graves' step momentum, torch's
      buffer times -lr). torch divides by sqrt(n) + eps, MXNet by
      sqrt(n + epsilon): epsilon is set to eps**2, so the two agree at n = 0
      and differ elsewhere by about as much as eps itself changes torch's
      step (relatively, eps / sqrt(n) at most). Refused: momentum without
      ``centered`` (MXNet's plain rmsprop has none).
    * ``Adagrad``: lr, eps -> ``AdaGrad`` (eps**2, as for RMSprop: torch
      divides by sqrt(sum) + eps, MXNet by sqrt(history + eps)). Refused:
      ``weight_decay`` (torch adds wd * w to the gradient, so it enters the
      history and is divided by its root; MXNet subtracts lr * wd * w
      outside), ``lr_decay`` and ``initial_accumulator_value``.

    Refused for every type: ``maximize``, parameter groups whose settings
    differ in anything but ``lr`` and ``weight_decay`` (the servers run one
    optimizer for every key), an optimizer that
    already holds state (it has stepped: the servers' state would start from
    zero), another optimizer class (a subclass too). Raises ValueError naming
    the setting.
    """
    kind = type(optimizer)
    mappers = {torch.optim.SGD: _from_sgd, torch.optim.Adam: _from_adam,
               torch.optim.RMSprop: _from_rmsprop, torch.optim.Adagrad: _from_adagrad}
    if kind not in mappers:
        raise ValueError("server_optimizer: %s.%s has no server-side equivalent (mapped: "
                         "torch.optim.SGD, Adam, RMSprop, Adagrad)"
                         % (kind.__module__, kind.__qualname__))
    what = "server_optimizer(torch.optim.%s)" % kind.__name__
    if any(float(st.get("step", 0)) > 0 or st.get("momentum_buffer") is not None
           for st in optimizer.state.values()):
        raise ValueError("%s: it holds state already (it has stepped); the servers' optimizer "
                         "would start from none: map it before training" % (what,))
    groups = optimizer.param_groups
    settings = {k: v for k, v in groups[0].items() if k != "params"}
    per_key = set()  # settings that differ between groups: per-key multipliers
    for i, g in enumerate(groups[1:], 1):
        for k in sorted(set(settings) | set(g) - {"params"}):
            if g.get(k) == settings.get(k):
                continue
            if k in ("lr", "weight_decay"):
                per_key.add(k)
                continue
            raise ValueError("%s: parameter groups 0 and %d differ in %s (%r, %r); the "
                             "servers run one optimizer for every parameter (groups may "
                             "differ in lr and weight_decay only: per-key multipliers)"
                             % (what, i, k, settings.get(k), g.get(k)))
    if per_key:
        if named_parameters is None:
            raise ValueError("%s: parameter groups differ in %s: give the parameters' names, "
                             "server_optimizer(optimizer, model), so that each parameter gets "
                             "its lr_mult and wd_mult" % (what, " and ".join(sorted(per_key))))
        # The largest of each setting; the multipliers are the ratios to it.
        settings["lr"] = max(float(g["lr"]) for g in groups)
        settings["weight_decay"] = max(float(g.get("weight_decay", 0.0)) for g in groups)

    def refuse_unless(ok, setting, why):
        if not ok:
            raise ValueError("%s: %s=%r cannot be mapped: %s"
                             % (what, setting, settings.get(setting), why))

    refuse_unless(not settings.get("maximize", False), "maximize",
                  "the servers' optimizers descend")
    try:
        mapped = mappers[kind](settings, refuse_unless)
    except (ValueError, TypeError) as e:
        if str(e).startswith(what):
            raise
        raise ValueError("%s: %s" % (what, e)) from None
    if per_key:
        _group_multipliers(what, mapped, groups, settings, named_parameters)
    return mapped


def _group_multipliers(what, mapped, groups, settings, named_parameters):
    """Sets mapped's lr_mult and wd_mult, by parameter name, from each group's
    lr and weight_decay as ratios to settings' (the largest)."""
    name_of = {id(p): n for n, p in _named(named_parameters)}
    lr_mult, wd_mult = {}, {}
    for i, g in enumerate(groups):
        lr = float(g["lr"]) / settings["lr"] if settings["lr"] > 0 else 1.0
        wd = (float(g.get("weight_decay", 0.0)) / settings["weight_decay"]
              if settings["weight_decay"] > 0 else 1.0)
        for j, p in enumerate(g["params"]):
            name = name_of.get(id(p))
            if name is None:
                raise ValueError("%s: parameter %d of group %d (shape %s) is not among the "
                                 "named parameters given" % (what, j, i, tuple(p.shape)))
            if lr != 1.0:
                lr_mult[name] = lr
            if wd != 1.0:
                wd_mult[name] = wd
    mapped.set_lr_mult(lr_mult)
    mapped.set_wd_mult(wd_mult)


def _from_sgd(s, refuse_unless):
    momentum = s.get("momentum", 0.0)
    refuse_unless(momentum == 0 or s.get("dampening", 0.0) == 0, "dampening",
                  "MXNet's momentum has no dampening")
    cls = _server.NAG if s.get("nesterov", False) else _server.SGD
    return cls(learning_rate=s["lr"], momentum=momentum, wd=s.get("weight_decay", 0.0))


def _from_adam(s, refuse_unless):
    refuse_unless(not s.get("amsgrad", False), "amsgrad", "MXNet's adam has no AMSGrad")
    beta1, beta2 = s.get("betas", (0.9, 0.999))
    return _server.Adam(learning_rate=s["lr"], beta1=beta1, beta2=beta2,
                        epsilon=s.get("eps", 1e-8), wd=s.get("weight_decay", 0.0))


def _from_rmsprop(s, refuse_unless):
    centered = bool(s.get("centered", False))
    momentum = s.get("momentum", 0.0)
    refuse_unless(centered or momentum == 0, "momentum",
                  "MXNet's rmsprop has a momentum only when centered (gamma2)")
    return _server.RMSProp(learning_rate=s["lr"], gamma1=s.get("alpha", 0.99),
                           gamma2=momentum if centered else 0.9,
                           epsilon=float(s.get("eps", 1e-8)) ** 2, centered=centered,
                           wd=s.get("weight_decay", 0.0))


def _from_adagrad(s, refuse_unless):
    refuse_unless(s.get("weight_decay", 0.0) == 0, "weight_decay",
                  "torch adds it to the gradient, inside the adaptive term; MXNet's adagrad "
                  "applies it outside (lr * wd * w), a different rule")
    refuse_unless(s.get("lr_decay", 0.0) == 0, "lr_decay",
                  "MXNet's adagrad has no rate decay (use a pstrain.lr_scheduler)")
    refuse_unless(s.get("initial_accumulator_value", 0.0) == 0, "initial_accumulator_value",
                  "the servers' history starts at zero")
    return _server.AdaGrad(learning_rate=s["lr"], eps=float(s.get("eps", 1e-10)) ** 2)


class DistributedOptimizer:
    """Trains through the servers; see the module's documentation.

    optimizer         a pstrain.optimizer.Optimizer (applied on the servers) or a
                      torch.optim.Optimizer over the same parameters (applied here)
    named_parameters  model.named_parameters(), or the model itself (which also
                      sets ``module``)
    kvstore           a dist KVStore (default: the open one, else dist_sync)
    module            the model: wait for a module's weights just before its forward
    batch_size        per-worker batch, for MXNet's rescale (1 for a mean loss)
    """

    def __init__(self, optimizer, named_parameters, kvstore=None, module=None, batch_size=1):
        if isinstance(named_parameters, torch.nn.Module) and module is None:
            module = named_parameters
        named = [(n, p) for n, p in _named(named_parameters) if p.requires_grad]
        names = [n for n, _ in named]
        if len(set(names)) != len(names):
            raise ValueError("DistributedOptimizer: parameter names must be unique")
        if len({id(p) for _, p in named}) != len(named):
            raise ValueError("DistributedOptimizer: a parameter is listed twice")
        if not named:
            raise ValueError("DistributedOptimizer: no parameter requires a gradient")
        self._kv = kv = _store(kvstore)
        if kv._client is None:
            raise ValueError("DistributedOptimizer needs a dist KVStore, not %r" % (kv.type,))
        self._names = names
        # The servers' keys: the parameter names, unless a store key of that
        # name was initialized already (an earlier DistributedOptimizer of the
        # same model, detached with remove_hooks(), or of another model with
        # the same names): then names under a prefix of this optimizer's own.
        # Every worker makes the same calls, so every worker picks the same.
        if any(kv._initialized(n) for n in names):
            kv._dist_optimizer_keys = getattr(kv, "_dist_optimizer_keys", 0) + 1
            prefix = "__dist_optimizer_%d__/" % kv._dist_optimizer_keys
            self._keys = [prefix + n for n in names]
        else:
            self._keys = list(names)
        self._params = [p for _, p in named]
        self._server_side = isinstance(optimizer, ServerOptimizer)
        if not self._server_side and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError("optimizer must be a pstrain.optimizer.Optimizer (server-side) or a "
                            "torch.optim.Optimizer (local), got %r" % (optimizer,))
        self._check_servers_free(kv)
        if not self._server_side and not kv._sync:
            raise ValueError("%s: a local torch optimizer needs the servers to sum gradients "
                             "(dist_sync); dist_async needs a server-side optimizer such as "
                             "pstrain.optimizer.SGD" % (kv.type,))
        self._rescale = 1.0 / (float(batch_size) * (kv.num_workers if kv._sync else 1))
        self._optimizer = optimizer
        self._handles = [None] * len(named)
        self._fired = [False] * len(named)
        # Seconds spent waiting for exchanges that were not done when needed:
        # the communication training did not hide.
        self.wait_seconds = 0.0
        self._issued = [0.0] * len(named)
        self._intervals = []  # (issued, answered) of each exchange waited for
        self._busy, self._busy_end = 0.0, float("-inf")  # the union of those folded

        # Every worker starts from rank 0's weights.
        if self._server_side:
            opt = copy.copy(optimizer)
            opt.rescale_grad = optimizer.rescale_grad * self._rescale
            # Multipliers named by parameter name go to that parameter's key
            # (which may be prefixed, above); those of parameters this
            # optimizer does not train (frozen ones server_optimizer named)
            # are left out, as they would name keys nobody initializes.
            key_of = dict(zip(names, self._keys))
            key_of.update((k, k) for k in self._keys)
            opt.lr_mult = {key_of[k]: m for k, m in optimizer.lr_mult.items() if k in key_of}
            opt.wd_mult = {key_of[k]: m for k, m in optimizer.wd_mult.items() if k in key_of}
            kv.init(self._keys, self._params)
            pulls = [kv.pull(k, out=p) for k, p in zip(self._keys, self._params)]
            for i, h in enumerate(pulls):
                try:
                    h.wait()
                except Error as e:
                    raise self._parameter_error(i, e) from None
            kv._set_optimizer(opt, "a DistributedOptimizer")
            self._outs = self._params  # the new weights land in the parameters
        else:
            broadcast_parameters(named, kvstore=kv)
            self._outs = [torch.zeros(p.shape, dtype=torch.float32) for p in self._params]
            # How many workers gave each parameter a gradient (the servers sum).
            kv._used_keys = getattr(kv, "_used_keys", 0) + 1
            self._used_key = "__pstrain_used_%d__" % kv._used_keys
            self._used = torch.zeros(len(self._params), dtype=torch.float32)
            kv.init(self._keys + [self._used_key], self._outs + [self._used])

        self._hooks = [p.register_hook(self._grad_hook(i)) for i, p in enumerate(self._params)]
        # The parameters step() waits for (server-side; local mode waits for all).
        self._step_waits = list(range(len(self._params)))
        if module is not None:
            index = {id(p): i for i, p in enumerate(self._params)}
            covered = set()
            for m in module.modules():
                # Every parameter m's forward may read: its own and, unless m is a
                # plain nn.Sequential (whose forward only calls its children, each
                # hooked here), its children's.
                through = isinstance(m, torch.nn.Sequential) and \
                    type(m).forward is torch.nn.Sequential.forward
                reads = [index[id(p)] for p in m.parameters(recurse=not through)
                         if id(p) in index]
                if reads:
                    self._hooks.append(m.register_forward_pre_hook(self._forward_hook(reads)))
                    covered.update(reads)
            self._step_waits = [i for i in range(len(self._params)) if i not in covered]

        kv._dist_optimizers.append(self)

    def _describe(self):
        return "a DistributedOptimizer (%s, parameters %s)" % (
            "server-side %r" % (self._optimizer,) if self._server_side
            else "local %s" % type(self._optimizer).__name__,
            ", ".join(self._names[:3]) + (", ..." if len(self._names) > 3 else ""))

    def _check_servers_free(self, kv):
        """Raises unless this optimizer can have the servers do what it needs."""
        others = kv._dist_optimizers
        if self._server_side and others:
            raise Error("FailedPrecondition: %s already uses this KVStore; the servers run one "
                        "optimizer for every key, so a second server-side DistributedOptimizer "
                        "would replace what they do for its parameters: wrap every parameter "
                        "in one DistributedOptimizer (or call remove_hooks() on the first)"
                        % (others[0]._describe(),))
        if not self._server_side:
            server = [o for o in others if o._server_side]
            if server:
                raise Error("FailedPrecondition: %s already uses this KVStore and the servers "
                            "apply its optimizer to every key; a local torch optimizer needs "
                            "servers that only sum the gradients" % (server[0]._describe(),))
            if kv._gc_threshold is not None:
                raise Error("FailedPrecondition: the KVStore compresses gradients "
                            "(set_gradient_compression); a local torch optimizer counts on "
                            "exact sums from the servers (how many workers gave each parameter "
                            "a gradient), which compression would quantize")
            if kv._optimizer_by is not None:
                raise Error("FailedPrecondition: the servers already run an optimizer (installed "
                            "by %s) and apply it to every key; a local torch optimizer needs "
                            "servers that only sum the gradients: create local "
                            "DistributedOptimizers before any server-side optimizer"
                            % (kv._optimizer_by,))

    # ---- hooks ----
    def _grad_hook(self, i):
        def hook(grad):
            self._exchange(i, grad)
            return None
        return hook

    def _forward_hook(self, indices):
        def hook(module, inputs):
            for i in indices:
                self._wait(i)
            return None
        return hook

    def _exchange(self, i, grad):
        if self._handles[i] is not None:  # a second backward in one step: keep the order
            self._wait(i)
        self._fired[i] = True
        self._issued[i] = time.perf_counter()
        self._handles[i] = self._kv.pushpull(self._keys[i], grad, out=self._outs[i],
                                             priority=-i)

    def _wait(self, i):
        h = self._handles[i]
        if h is None:
            return
        self._handles[i] = None
        start = None if h.done() else time.perf_counter()
        try:
            h.wait()
        except Error as e:
            raise self._parameter_error(i, e) from None
        if start is not None:
            self.wait_seconds += time.perf_counter() - start
        self._intervals.append((self._issued[i], h.done_at()))
        if len(self._intervals) >= 4096:
            self._fold()

    def _parameter_error(self, i, e):
        """pstrain.Error `e` of parameter i's exchange, naming the parameter: the
        servers' message names the store's int key."""
        p = self._params[i]
        hint = ""
        if re.search(r"request has \d+ elements, stored value has \d+", str(e)):
            hint = (" (worker 0's %r, which the servers hold, has another size: every "
                    "worker must build the same model)" % (self._names[i],))
        return Error("DistributedOptimizer: parameter %r (shape %s on worker %d): %s%s"
                     % (self._names[i], tuple(p.shape), self._kv.rank, e, hint))

    def _fold(self):
        # The union of the intervals, swept in start order past a watermark (an
        # interval waited for after a fold counts from the watermark on).
        total, end = self._busy, self._busy_end
        for a, b in sorted(self._intervals):
            if b > end:
                total += b - max(a, end)
                end = b
        self._busy, self._busy_end, self._intervals = total, end, []

    @property
    def comm_seconds(self):
        """Seconds during which at least one exchange was in flight (issued and
        not yet answered), over the exchanges waited for so far. With
        ``wait_seconds``, the share of communication hidden behind computation
        is 1 - wait_seconds / comm_seconds."""
        self._fold()
        return self._busy

    # ---- optimizer interface ----
    def synchronize(self):
        """Waits for every exchange in flight (the parameters are then current)."""
        for i in range(len(self._params)):
            self._wait(i)

    def step(self, closure=None):
        """Ends the step. Parameters autograd gave no gradient push zeros (a dist_sync
        round needs every worker's push). Local mode: waits for the summed gradients
        and runs the wrapped optimizer (a parameter no worker gave a gradient keeps
        ``p.grad`` None); server-side: waits only for the parameters no forward
        pre-hook waits for (all of them without ``module``)."""
        if closure is not None:
            raise ValueError("DistributedOptimizer.step: closures are not supported")
        used = None
        if not self._server_side:
            mine = torch.tensor([1.0 if fired or p.grad is not None else 0.0
                                 for fired, p in zip(self._fired, self._params)])
            used = self._kv.pushpull(self._used_key, mine, out=self._used,
                                     priority=-len(self._params))
        for i, fired in enumerate(self._fired):
            if not fired:
                self._exchange(i, torch.zeros(self._params[i].shape, dtype=torch.float32))
        self._fired = [False] * len(self._params)
        if self._server_side:
            for i in self._step_waits:
                self._wait(i)
            return None
        self.synchronize()
        used.wait()
        for p, summed, users in zip(self._params, self._outs, self._used.tolist()):
            if users == 0:
                continue  # no worker's gradient: p.grad stays None, torch skips it
            g = summed.to(p.device, p.dtype) * self._rescale
            if p.grad is None:
                p.grad = g
            else:
                p.grad.copy_(g)
        return self._optimizer.step()

    def zero_grad(self, set_to_none=True):
        """Clears the gradients (server-side: they are not used after the exchange)."""
        if self._server_side:
            for p in self._params:
                p.grad = None
        else:
            self._optimizer.zero_grad(set_to_none=set_to_none)

    @property
    def param_groups(self):
        """The wrapped optimizer's groups. Server-side: one read-only group with
        every parameter and the servers' settings: ``lr``, ``weight_decay``,
        ``optimizer`` (its MXNet name: "sgd", "adam", ...; "nag" also says
        ``nesterov``), ``lr_scheduler`` and the rest under MXNet's names
        (``momentum``, ``beta1``, ``epsilon``, ``rescale_grad``, ...); change
        them with a new optimizer (or a ``pstrain.lr_scheduler``), not here."""
        if not self._server_side:
            return self._optimizer.param_groups
        opt = self._optimizer
        group = {"params": list(self._params), "lr": opt.learning_rate,
                 "weight_decay": opt.wd, "optimizer": opt.type_name,
                 "lr_scheduler": opt.lr_scheduler}
        for k, v in opt.to_dict().items():
            if k not in ("type", "learning_rate", "wd", "lr_scheduler"):
                group[k] = v
        if opt.type_name == "nag":
            group["nesterov"] = True
        return [types.MappingProxyType(group)]

    def state_dict(self):
        """The local optimizer's state; server-side state stays on the servers ({})."""
        return {} if self._server_side else self._optimizer.state_dict()

    def load_state_dict(self, state):
        if not self._server_side:
            self._optimizer.load_state_dict(state)

    def remove_hooks(self):
        """Detaches from the model (waits for what is in flight first); another
        DistributedOptimizer may then take the servers' optimizer over."""
        self.synchronize()
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self in self._kv._dist_optimizers:
            self._kv._dist_optimizers.remove(self)

    @property
    def kvstore(self):
        return self._kv
