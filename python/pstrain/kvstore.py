"""KVStore: MXNet's kvstore API over pstrain's parameter servers.

Types (MXNet 1.x's rule): a name containing ``dist`` is a distributed store,
synchronous unless it contains ``_async`` (``dist_sync``, ``dist_async``,
``dist_device_sync``, ...); ``local`` (or ``device``) keeps every value in this
process and applies the optimizer here (the same C++ optimizer the servers run).

Values are float32. A NumPy array that is float32 and C-contiguous, or a CPU
PyTorch tensor that is float32 and contiguous, is handed to the C++ client as
it is: it sends from (and pulls into) that memory, with no copy here; anything
else is converted into a temporary (a pull copies it back into ``out`` when
its handle is waited for).

Requests do not block: ``push``, ``pull`` and ``pushpull`` return a
:class:`Handle`; ``wait()`` blocks until the servers answered and raises
``pstrain.Error`` if they could not (a dead server, a deadline). Until then the
arrays given must not be changed (a push's) or read (a pull's); the store
keeps them alive. ``init``, ``broadcast``, ``set_optimizer`` and ``barrier``
block. Every wait has a deadline (``PSTRAIN_REQUEST_TIMEOUT_MS``,
``PSTRAIN_BARRIER_TIMEOUT_MS``); a dead node fails every request within the
heartbeat timeout. A request that failed while nobody waited for it raises
its error at the next ``waitall`` or ``close``, or ``barrier`` once its
failure has come back (once). A pull (or
pushpull) of a key comes after this worker's earlier pushes of it, as in
MXNet: its ``wait()`` also waits for them, and raises the error of one that
failed and whose error nobody has seen yet (a dist_async push refused because
no optimizer was configured, say).

A worker's store ends the worker's part in the job when it is closed, or at
exit: it tells the scheduler the worker finished, or, when the script died of
an exception, that it failed (the job then stops at once).
"""
import atexit
import json
import math
import numbers
import os
import sys
import threading
import time
import zipfile

import numpy as np

from . import _pstrain
from ._pstrain import Error
from .optimizer import Optimizer
from .optimizer import _multipliers as _checked_multipliers

__all__ = ["KVStore", "Handle", "create"]

# Open dist stores: kept alive until closed (dropping one would leave the job
# waiting for a worker that no longer answers) and closed at exit.
_OPEN = []
_OPEN_LOCK = threading.Lock()


def _torch_tensor_type():
    torch = sys.modules.get("torch")
    return None if torch is None else torch.Tensor


def _is_tensor(x):
    t = _torch_tensor_type()
    return t is not None and isinstance(x, t)


def _source(x, what):
    """A float32 C-contiguous NumPy view of x's values (a copy if x's memory does not allow)."""
    if _is_tensor(x):
        import torch
        t = x.detach()
        if t.device.type != "cpu" or t.dtype != torch.float32 or not t.is_contiguous():
            t = t.to(device="cpu", dtype=torch.float32).contiguous()
        return t.numpy()  # shares t's memory and keeps t alive
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x, dtype=np.float32)  # x itself when it already fits
    try:
        return np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    except (TypeError, ValueError) as e:
        raise TypeError("%s: expected a NumPy array or a PyTorch tensor, got %s (%s)"
                        % (what, type(x).__name__, e))


def _dest(x, what):
    """(array to receive into, function copying it into x or None) for destination x."""
    if _is_tensor(x):
        import torch
        t = x.detach()
        if t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous():
            return t.numpy(), None
        tmp = np.empty(tuple(t.shape), dtype=np.float32)
        return tmp, lambda: t.copy_(torch.from_numpy(tmp))
    if isinstance(x, np.ndarray):
        if not x.flags.writeable:
            raise ValueError("%s: the array is read-only" % what)
        if x.dtype == np.float32 and x.flags.c_contiguous:
            return x, None
        tmp = np.empty(x.shape, dtype=np.float32)
        return tmp, lambda: np.copyto(x, tmp, casting="unsafe")
    raise TypeError("%s: expected a NumPy array or a PyTorch tensor, got %s"
                    % (what, type(x).__name__))


def _as_list(v):
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _devices(v):
    """A value as its arrays, one per device: a list or tuple of NumPy arrays or
    tensors holds one per device (MXNet); anything else (an array, a list of
    numbers) is one array."""
    if isinstance(v, (list, tuple)) and v and all(
            isinstance(x, np.ndarray) or _is_tensor(x) for x in v):
        return list(v)
    return [v]


def _outputs_after(name, what, whose, first, copy_back, extras):
    """What runs once `first` holds a key's value: its copy back (if any), then
    a copy into each of `extras` (outputs 2, 3, ...), each checked to hold as
    many elements as `first` (`whose` size, in the message)."""
    after = [copy_back] if copy_back is not None else []
    for n, extra in enumerate(extras, 2):
        d, cb = _dest(extra, "%s output of key %r" % (what, name))
        if d.size != first.size:
            raise ValueError("%s of key %r: output %d has %d elements, %s %d"
                             % (what, name, n, d.size, whose, first.size))
        after.append(lambda d=d, cb=cb: (np.copyto(d, first.reshape(d.shape)), cb and cb()))
    return after


class Handle:
    """A request in flight. ``wait()`` returns once it is done, or raises pstrain.Error.

    Thread-safe: any thread may wait for it (the copies into the caller's
    arrays run once, and every waiter returns after them).
    """

    def __init__(self, store, completions, keep, after, earlier=()):
        self._lock = threading.Lock()  # held while settling (not while waiting)
        self._store = store
        self._completions = completions
        self._keep = keep  # the arrays the servers read or write until done
        self._after = after  # copies into the caller's arrays, run once done
        # A pull's: this worker's pushes of its key issued before it and not
        # known to have succeeded (every one, so no need to look through
        # theirs). It is done once they are too, and reports the first unseen
        # error among them (then keeps it as its own).
        self._earlier = list(earlier)
        self._earlier_error = None
        self._finished = False
        self._error = None
        self._reported = False  # whether a wait() raised _error

    def done(self):
        """Whether the servers answered (or the request failed); never blocks."""
        return self._answered() and all(p._answered() for p in self._earlier)

    def _answered(self):
        return self._finished or self._error is not None or all(
            c.done() for c in self._completions)

    def done_at(self):
        """When the servers' last answer came (time.perf_counter()'s clock); NaN until done."""
        times = [c.done_at() for c in self._completions]
        return max(times) if times and not any(math.isnan(t) for t in times) else float("nan")

    def wait(self, timeout=None):
        """Blocks until done; raises pstrain.Error if the request failed (or the
        exception of a failed copy into the caller's array).

        ``timeout`` in seconds: past it pstrain.Error (DeadlineExceeded) is
        raised and the request stays in flight (wait again). None: the
        store's request deadline, past which the request counts as failed.
        """
        self._settle(timeout)
        error = self._take_error()
        if error is not None:
            raise error

    def _take_error(self):
        """The error wait() raises, counted as seen: this request's own, else the
        first unseen error of an earlier push of its key. REQUIRES: settled."""
        if self._error is not None:
            self._reported = True
            return self._error
        with self._lock:
            if self._earlier:
                self._earlier_error = self._store._take_unreported(self._earlier)
                self._earlier = []
            return self._earlier_error

    def _settle(self, timeout=None):
        if self._finished or self._error is not None:
            return
        # The caller's timeout bounds the whole wait, not each completion's.
        end = None if timeout is None else time.monotonic() + max(0.0, timeout)
        failure = None
        try:
            for c in self._completions:
                ms = (self._store._timeout_ms if end is None
                      else max(0, int((end - time.monotonic()) * 1000)))
                c.wait(ms)  # thread-safe, without the lock: another waiter may time out
        except Error as e:
            if timeout is not None and not all(c.done() for c in self._completions):
                raise  # the caller's own timeout: still in flight, wait again later
            failure = e
        if failure is None:
            # The earlier pushes of a pull's key: their answers may come after
            # the pull's (another server part, another connection).
            for p in self._earlier:  # oldest first: p's own earlier ones are settled
                p._settle(None if end is None else max(0.0, end - time.monotonic()))
        with self._lock:
            if self._finished or self._error is not None:
                return  # another thread settled it meanwhile
            if failure is not None:
                # The request may still be held by the transport: its buffers
                # stay alive until the store is closed.
                self._error = failure
                self._store._abandon(self)
                return
            try:
                for f in self._after:
                    f()
            except Exception as e:  # a copy into the caller's array failed
                self._keep = self._after = None
                self._error = e
                self._store._abandon(self)
                return
            self._keep = None
            self._after = None
            self._earlier = [p for p in self._earlier if p._error is not None]
            self._finished = True
            self._store._forget(self)


class KVStore:
    """MXNet's KVStore: ``init``, ``push``, ``pull``, ``pushpull``, ``broadcast``,
    ``set_optimizer``, ``set_gradient_compression``, ``barrier``, ``rank``,
    ``num_workers``; ``save_optimizer_states`` and ``load_optimizer_states``
    for in-process stores.

    Keys are ints, or strings (mapped to ints in the order they are first
    initialized, as MXNet does; every worker must initialize them in the same
    order); one store uses one kind. A call takes one key and one value, or a
    list of keys and a list of values; a value may itself be a list of arrays
    (one per device, as in MXNet): a push sends their sum, a pull fills each.
    A key given more than once in one call is one key with all those values
    (MXNet's grouping): a push sends their sum, a pull fills each output. A
    list of numbers is one array, not one value per device.

    Each key keeps the shape this worker initialized it with: a push, pull
    or pushpull of an array of another shape raises ValueError, as MXNet's
    shape check does (a flat array of as many elements fits any shape).
    """

    def __init__(self, kvtype="dist_sync"):
        kvtype = str(kvtype).lower()
        self.type = kvtype
        self._lock = threading.Lock()
        self._pending = {}  # id -> Handle not yet settled
        # int key -> its push and pushpull Handles not known to have succeeded,
        # which a later pull of the key waits for (and reports the error of).
        self._pushes = {}
        # Failed handles: their buffers live until close; the first error no
        # wait() raised is raised by the next waitall, barrier or close.
        self._failed = []
        self._str_keys = {}
        self._str_names = []  # int key -> the str key's name
        self._key_kind = None
        self._sizes = {}
        self._shapes = {}  # int key -> the shape this worker initialized it with
        self._closed = False
        self._client = None
        # The servers' optimizer: who installed it (None: none, the servers sum),
        # and the pstrain.torch.DistributedOptimizers using this store.
        self._optimizer_by = None
        self._dist_optimizers = []
        # 2-bit gradient compression: its threshold, or None (off).
        self._gc_threshold = None
        if "dist" in kvtype:
            from . import run_role
            run_role()  # scheduler and servers never get past this line
            self._sync = "_async" not in kvtype
            with _OPEN_LOCK:
                if any(not s._closed for s in _OPEN):
                    raise Error("FailedPrecondition: this process already has an open dist "
                                "KVStore (one worker per process): close it first")
                self._client = _launched_client(kvtype)
                _OPEN.append(self)
            self._timeout_ms = self._client.request_timeout_ms + 10000
            self._generation = 0
            # What the servers were last sent: optimizer config, lr_mult, wd_mult.
            self._server_optimizer = (None, {}, {})
            # MXNet's workers send the sync mode at creation; the optimizer follows.
            try:
                self._client.configure(self._sync, None, self._generation, {})
            except BaseException as e:
                # Nobody holds this store: close it (as failed) so that it is
                # not left open, keeping another from being made.
                self._fail("configuring the servers failed: %s" % (e,))
                raise
        elif kvtype in ("local", "device"):
            self._sync = True
            self._timeout_ms = 0
            self._values = {}
            self._updater = None
            self._updater_cfg = None
            self._updater_mults = ({}, {})  # its lr_mult and wd_mult, by int key
            self._py_updater = None  # set_updater's function
            # Compression's residuals: per key, one per device value of a push.
            self._residuals = {}
        else:
            raise ValueError("unknown KVStore type %r (dist_sync, dist_async, "
                             "dist_device_sync, local)" % (kvtype,))

    # ---- job ----
    @property
    def rank(self):
        """This worker's rank in [0, num_workers)."""
        return self._client.rank if self._client is not None else 0

    @property
    def num_workers(self):
        return self._client.num_workers if self._client is not None else 1

    @property
    def num_servers(self):
        return self._client.num_servers if self._client is not None else 0

    OPTIMIZER = "optimizer"  # MXNet's KVStoreBase.OPTIMIZER, for is_capable

    def is_capable(self, capability):
        """MXNet's ``kv.is_capable``: whether this store can do ``capability``.
        ``KVStore.OPTIMIZER`` ("optimizer"): it applies an optimizer
        (``set_optimizer``), as every pstrain store does."""
        if capability == self.OPTIMIZER:
            return True
        raise ValueError("is_capable: unknown capability %r (known: %r)"
                         % (capability, self.OPTIMIZER))

    def barrier(self):
        """Blocks until every worker reached the barrier (the barrier deadline bounds it).

        First raises the first error of a request that failed unseen, among
        those answered by then. It waits for none in flight: as MXNet's
        (``_barrier`` is ps-lite's barrier of the worker group), it is the
        workers' barrier alone, so in dist_sync a worker that pushed a key
        before it and one that pushes the key after it both get through
        (waiting for the first's push would wait for the second's, which
        waits in the barrier). ``waitall`` waits.
        """
        self._settle_answered()
        self._raise_unreported()
        if self._client is not None:
            self._client.barrier()

    _barrier = barrier  # MXNet's name

    def set_optimizer(self, optimizer):
        """Has the servers (``local``: this store) apply ``optimizer`` to every push.

        Every worker calls it with the same optimizer; it waits for this
        worker's requests and passes a worker barrier first, so it may follow
        ``init`` or come before it (its
        ``lr_mult`` and ``wd_mult`` may name string keys initialized later,
        and apply to each key's updates from then on). The servers
        run one optimizer for every key: refused while a
        ``pstrain.torch.DistributedOptimizer`` uses this store (it relies on the
        servers' optimizer, or on servers that only sum).
        """
        if self._dist_optimizers:
            raise Error("FailedPrecondition: set_optimizer: %s uses this KVStore and relies on "
                        "the servers' %s; the servers run one optimizer for every key (call "
                        "its remove_hooks() first)"
                        % (self._dist_optimizers[0]._describe(),
                           "optimizer" if self._dist_optimizers[0]._server_side
                           else "summing only"))
        self._set_optimizer(optimizer, "set_optimizer")

    def set_updater(self, updater):
        """MXNet's ``kv._set_updater``: ``updater(key, input, stored)`` runs
        on every push to a ``local`` or ``device`` store instead of an
        optimizer. ``key`` is the key as the user gave it (int or str);
        ``input`` the value pushed (the sum of its devices' values); ``stored``
        the store's value, which the updater changes in place (``stored +=
        input * 2``, ...). Both are float32 NumPy arrays of the key's shape,
        for the call's duration (``input`` read-only). An exception it raises reaches
        the push's caller, the stored value as the updater left it. It
        replaces ``set_optimizer``'s optimizer, as that replaces it (None
        removes a Python updater: pushes then store their value). A dist store
        refuses it:
        its servers apply ``set_optimizer``'s optimizer (MXNet pickles that;
        pstrain sends its settings).
        """
        if self._client is not None:
            raise Error("FailedPrecondition: set_updater: a dist store's servers apply the "
                        "optimizer of set_optimizer; a Python updater runs in local and device "
                        "stores only")
        if updater is not None and not callable(updater):
            raise TypeError("set_updater takes a function updater(key, input, stored), got %r"
                            % (updater,))
        self._py_updater = updater
        if updater is not None:
            self._updater, self._updater_cfg = None, None

    _set_updater = set_updater  # MXNet's name

    def _set_optimizer(self, optimizer, by):
        if not isinstance(optimizer, Optimizer):
            raise TypeError("set_optimizer takes a pstrain.optimizer.Optimizer "
                            "(pstrain.optimizer.SGD, ...), got %r" % (optimizer,))
        cfg = optimizer.to_dict()
        # A string key a multiplier names before its init is numbered here (in
        # the optimizer's order, the same on every worker), as init would.
        lr_mult = self._multipliers(optimizer, "lr_mult")
        wd_mult = self._multipliers(optimizer, "wd_mult")
        if self._client is None:
            self._updater = _pstrain.LocalUpdater(cfg, lr_mult, wd_mult)
            self._updater_cfg = cfg
            self._updater_mults = (lr_mult, wd_mult)
            self._py_updater = None
            return
        # This worker's pushes are answered first (their rounds closed by the
        # optimizer they were made for), and no worker may still be sending
        # the previous configuration.
        self.waitall()
        self.barrier()
        self._configure((cfg, lr_mult, wd_mult), self._gc_threshold)
        self._optimizer_by = by

    def set_gradient_compression(self, compression_params):
        """MXNet's 2-bit gradient compression: ``{'type': '2bit', 'threshold': t}``
        (``threshold`` defaults to 0.5; ``{'type': 'none'}`` turns it off).

        From then on each push sends, per element, +t, -t or 0, and keeps what
        it did not send in a residual that the next push of the key adds to its
        gradient (MXNet's rule, ``pstrain train --gc-type 2bit``'s codec); init
        and pulls stay float32. The gradients given are not changed. A dist
        store compresses on the wire (a sixteenth of the bytes) and keeps a
        residual per key; every worker calls it, as ``set_optimizer``: it waits
        for this worker's requests and passes a worker barrier, and the servers
        keep their optimizer. A ``device`` store quantizes each device's value
        before summing them (a residual per key and device); ``local`` refuses
        it, as MXNet does.
        """
        if not isinstance(compression_params, dict):
            raise TypeError("set_gradient_compression takes a dict such as "
                            "{'type': '2bit', 'threshold': 0.5}, got %r" % (compression_params,))
        unknown = sorted(set(map(str, compression_params)) - {"type", "threshold"})
        if unknown:
            raise ValueError("set_gradient_compression: unknown parameter %s (known: type, "
                             "threshold)" % ", ".join(repr(u) for u in unknown))
        kind = compression_params.get("type")
        if kind not in ("2bit", "none"):
            raise ValueError("set_gradient_compression: type %r is not a gradient compression "
                             "(known: '2bit', 'none')" % (kind,))
        threshold = None
        if kind == "2bit":
            t = compression_params.get("threshold", 0.5)
            try:
                if isinstance(t, bool):
                    raise ValueError
                threshold = float(t)
            except (TypeError, ValueError):
                raise ValueError("set_gradient_compression: threshold %r is not a number" % (t,))
            # (NaN, Inf, <= 0, and what float32 turns into 0 or Inf; the cast
            # past float32's range is no warning here, it is refused)
            with np.errstate(over="ignore"):
                t32 = np.float32(threshold)
            if not (np.isfinite(t32) and t32 > 0):
                raise ValueError("set_gradient_compression: threshold %r must be a finite "
                                 "number > 0 in float32's range" % (t,))
        local_opt = [d for d in self._dist_optimizers if not d._server_side]
        if threshold is not None and local_opt:
            raise Error("FailedPrecondition: set_gradient_compression: %s uses this KVStore "
                        "and counts on exact sums from the servers (how many workers gave each "
                        "parameter a gradient); compression would quantize them"
                        % (local_opt[0]._describe(),))
        if self._client is None:
            if self.type == "local":
                raise ValueError("set_gradient_compression: gradient compression is not "
                                 "supported by a 'local' store (MXNet's rule; use 'device' or "
                                 "a dist store)")
            if threshold is None:
                self._residuals = {}
            self._gc_threshold = threshold
            return
        # A push of the old setting still in flight could reach a server that
        # already takes the new one (a 2-bit push it would refuse).
        self.waitall()
        self.barrier()
        self._configure(self._server_optimizer, threshold)

    def save_optimizer_states(self, fname, dump_optimizer=False):
        """Writes the optimizer's state to ``fname``; with ``dump_optimizer``
        the optimizer's settings too. ``local``/``device`` stores only: in a
        dist store the servers hold it (MXNet's rule).

        The file is a NumPy ``.npz`` read without pickle: ``meta`` (JSON, as
        bytes) holds the format version (2), the optimizer's type and the
        names of the arrays each key's state holds (its slots:
        ``["mean", "var"]`` for adam, ``["momentum"]`` for sgd with momentum,
        ...), the schedule's clock (``num_update``), per key its name, update
        count, lr_mult and wd_mult, the settings (or null) and the optimizer's
        multipliers (``{"lr_mult": [[key, m], ...], "wd_mult": ...}``, every
        key they name, or null); ``s<i>`` holds
        key i's slots back to back, float32 (empty for a key that has none).
        """
        updater = self._local_updater("save_optimizer_states")
        slots = _pstrain.optimizer_slots(self._updater_cfg)
        num_update, states = updater.get_states()
        names = self._key_names()
        keys, arrays = [], {}
        for i, (ikey, updates, lr_mult, wd_mult, state) in enumerate(
                sorted(states, key=lambda s: s[0])):
            keys.append([names.get(ikey, ikey), updates, lr_mult, wd_mult])
            arrays["s%d" % i] = np.frombuffer(state, np.float32)
        meta = {"format": "pstrain optimizer states", "version": 2,
                "optimizer_type": self._updater_cfg["type"], "slots": list(slots),
                "num_update": num_update, "keys": keys,
                "optimizer": self._updater_cfg if dump_optimizer else None,
                "multipliers": {
                    what: [[names.get(k, k), m] for k, m in sorted(mults.items())]
                    for what, mults in zip(("lr_mult", "wd_mult"), self._updater_mults)}
                if dump_optimizer else None}
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        # Written beside it and renamed over it: a save cut short leaves the
        # last whole file, not a truncated one.
        part = "%s.part%d" % (os.fspath(fname), os.getpid())
        try:
            with open(part, "wb") as f:
                np.savez(f, **arrays)
            os.replace(part, fname)
        except BaseException:
            try:
                os.remove(part)
            except OSError:
                pass
            raise

    def load_optimizer_states(self, fname):
        """Reads what ``save_optimizer_states`` wrote: the keys must be
        initialized (with their sizes then); a file saved with
        ``dump_optimizer`` installs its optimizer (with each key's lr_mult
        and wd_mult as saved), else the store needs one
        (``set_optimizer``) of the type that wrote the file, keeping the same
        slots (a file of one that kept none, sgd without momentum say, also
        loads into one that keeps some: they start at zero). The state read
        replaces the current one (into the store's own optimizer, that
        optimizer's multipliers go on applying). Files of version 1 (sgd's momentum, written
        before the other optimizers existed) load into sgd and test.
        """
        self._local_updater("load_optimizer_states", need_one=False)
        where = "load_optimizer_states: %s" % (fname,)
        try:
            with np.load(fname, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
            meta = json.loads(arrays["meta"].tobytes().decode())
            if (not isinstance(meta, dict) or meta.get("format") != "pstrain optimizer states"
                    or meta.get("version") not in (1, 2)):
                raise ValueError("not a pstrain optimizer state file (version 1 or 2)")
            version = meta["version"]
            entries = meta["keys"]
            num_update = _whole(meta["num_update"])
            cfg = meta["optimizer"]
            if not isinstance(entries, list) or not isinstance(cfg, (dict, type(None))):
                raise ValueError("its keys or optimizer are malformed")
            if version == 1:
                written_type, written_slots, prefix = None, None, "m"
            else:
                written_type, written_slots, prefix = (meta["optimizer_type"], meta["slots"],
                                                       "s")
                if (not isinstance(written_type, str) or not isinstance(written_slots, list)
                        or not all(isinstance(n, str) for n in written_slots)):
                    raise ValueError("its optimizer type or slots are malformed")
        # (a truncated file is a zipfile.BadZipFile, an empty one an EOFError
        # with NumPy 2: neither is an OSError or a ValueError)
        except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError, EOFError,
                zipfile.BadZipFile) as e:
            raise ValueError("%s: %s" % (where, e)) from None
        if cfg is not None:
            try:
                updater = _pstrain.LocalUpdater(cfg)
                slots = _pstrain.optimizer_slots(cfg)
            except (ValueError, TypeError, RuntimeError) as e:
                raise ValueError("%s: its optimizer: %s" % (where, e)) from None
            opt_type = cfg.get("type", "sgd")
        elif self._updater is not None:
            updater = self._updater
            slots = _pstrain.optimizer_slots(self._updater_cfg)
            opt_type = self._updater_cfg["type"]
        else:
            raise ValueError("%s: the file holds no optimizer (saved without dump_optimizer) "
                             "and this store has none: set_optimizer first" % (where,))
        slots = list(slots)
        if version == 1:
            # sgd's momentum (or nothing: test, sgd without momentum).
            if opt_type not in ("sgd", "test"):
                raise ValueError("%s: a version 1 file holds sgd's momentum; this store's "
                                 "optimizer is %s" % (where, opt_type))
            written_slots = (["momentum"] if any(
                arrays.get("m%d" % i, np.empty(0)).size for i in range(len(entries))) else [])
        elif written_type != opt_type:
            raise ValueError("%s: the state was written by the %s optimizer (slots %s); this "
                             "store's is %s: another optimizer's state cannot be loaded"
                             % (where, written_type, written_slots, opt_type))
        if written_slots and written_slots != slots:
            raise ValueError("%s: each key's state holds %s, but this store's %s keeps %s: "
                             "load it into one of the same settings (centered, momentum)"
                             % (where, written_slots, opt_type, slots or "nothing"))
        states = []
        for i, entry in enumerate(entries):
            try:
                name, updates, lr_mult, wd_mult = entry
                state = arrays["%s%d" % (prefix, i)]
                updates, lr_mult, wd_mult = _whole(updates), float(lr_mult), float(wd_mult)
                if not (math.isfinite(lr_mult) and math.isfinite(wd_mult)):
                    raise ValueError
            except (ValueError, TypeError, KeyError, OverflowError):
                raise ValueError("%s: key entry %d is malformed" % (where, i)) from None
            try:
                ikey = self._key(name, create=False)
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError("%s: key %r: %s" % (where, name, e)) from None
            size = self._sizes.get(ikey)
            if size is None:
                raise ValueError("%s: key %r is not initialized in this store (init the keys "
                                 "first)" % (where, name))
            want = len(written_slots) * size
            if state.dtype != np.float32 or state.size not in (0, want):
                raise ValueError("%s: key %r: state of %d %s values, but %d slot(s) %s of a key "
                                 "of %d hold %d" % (where, name, state.size, state.dtype,
                                                    len(written_slots), written_slots, size,
                                                    want))
            states.append((ikey, updates, lr_mult, wd_mult, state.tobytes()))
        if cfg is not None:
            # The optimizer the file holds, with its multipliers (files that
            # do not list them: those its keys' states applied).
            mults = meta.get("multipliers")
            try:
                if isinstance(mults, dict):
                    loaded_mults = tuple({self._key(k, create=True): float(m)
                                          for k, m in mults[what]}
                                         for what in ("lr_mult", "wd_mult"))
                else:
                    loaded_mults = ({s[0]: s[2] for s in states if s[2] != 1.0},
                                    {s[0]: s[3] for s in states if s[3] != 1.0})
                updater = _pstrain.LocalUpdater(cfg, *loaded_mults)
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError("%s: its multipliers: %s" % (where, e)) from None
        try:
            updater.set_states(num_update, states)
        except (ValueError, TypeError) as e:
            raise ValueError("%s: %s" % (where, e)) from None
        if cfg is not None:
            self._updater, self._updater_cfg = updater, cfg
            self._updater_mults = loaded_mults
            self._py_updater = None

    def _multipliers(self, optimizer, what):
        """The optimizer's lr_mult or wd_mult by int key; keys and values
        checked (they may have been set as attributes)."""
        checked = _checked_multipliers("set_optimizer", what, getattr(optimizer, what))
        # (Numbered only once every value is known good.)
        return {self._key(k, create=True): m for k, m in checked.items()}

    def _local_updater(self, what, need_one=True):
        if self._client is not None:
            raise Error("FailedPrecondition: %s: the servers hold the optimizer's state in a "
                        "dist store (as in MXNet, local and device stores only)" % (what,))
        if need_one and self._updater is None and self._py_updater is not None:
            raise ValueError("%s: this store runs a Python updater (set_updater), whose state "
                             "is its own" % (what,))
        if need_one and self._updater is None:
            raise ValueError("%s: this store has no optimizer (set_optimizer first)" % (what,))
        return self._updater

    def _key_names(self):
        """int key -> the user's key (a str key's name)."""
        return {i: name for name, i in self._str_keys.items()}

    def _configure(self, server_optimizer, gc_threshold):
        """Sends the servers their next configuration generation. The number is
        used up even if that fails (some servers may have taken it), so the
        next configuration, whatever it holds, has a newer one."""
        cfg, lr_mult, wd_mult = server_optimizer
        self._generation += 1
        self._client.configure(self._sync, cfg, self._generation, wd_mult, gc_threshold,
                               lr_mult=lr_mult)
        self._server_optimizer = server_optimizer
        self._gc_threshold = gc_threshold

    def close(self):
        """Waits for every request, then ends this worker's part in the job.

        Tells the scheduler this worker finished and waits for the job's end
        (every worker finished). Idempotent; called at exit if not before.
        """
        if self._closed:
            return
        for h in self._pending_handles():
            h._settle()
        error = self._unreported_error()
        self._closed = True
        if self._client is not None:
            self._client.close("" if error is None else "a request failed: %s" % error)
            self._failed = []
            self._pushes = {}
        if error is not None:
            raise error

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None or (isinstance(exc, SystemExit) and exc.code in (0, None)):
            self.close()  # sys.exit(0) and sys.exit() are a normal end
        elif isinstance(exc, SystemExit):
            self._fail("the worker's script called sys.exit(%r)" % (exc.code,))
        else:
            self._fail("the worker's script raised %s: %s" % (exc_type.__name__, exc))

    def _fail(self, why):
        """Ends this worker's part with an error (the job stops)."""
        if self._closed:
            return
        self._closed = True
        if self._client is not None:
            self._client.close(why)

    # ---- keys ----
    def _initialized(self, name):
        """Whether string key ``name`` was initialized on this store."""
        return self._key_kind == "str" and name in self._str_keys and \
            self._str_keys[name] in self._sizes

    def _key(self, k, create):
        _store_calls[0] += 1
        kind = "str" if isinstance(k, str) else "int"
        if kind == "int" and (isinstance(k, bool) or not isinstance(k, numbers.Integral)):
            raise TypeError("key %r: a key is an int or a str, not a %s" % (k, type(k).__name__))
        if self._key_kind not in (None, kind):
            raise TypeError("this store's keys are %ss; got the %s key %r (one kind per store, as "
                            "in MXNet)" % (self._key_kind, kind, k))
        if kind == "int":
            k = int(k)
            if k < 0 or k > _pstrain.MAX_KEY:
                raise ValueError("key %r: int keys are in [0, %d]" % (k, _pstrain.MAX_KEY))
        # Only a key made fixes the store's kind (a failed pull or load of a
        # key never initialized leaves it open).
        if create:
            self._key_kind = kind
        if kind == "int":
            return k
        if k not in self._str_keys:
            if not create:
                raise KeyError("key %r was never initialized (init it first)" % (k,))
            self._str_keys[k] = len(self._str_keys)
            self._str_names.append(k)
        return self._str_keys[k]

    def _pairs(self, key, value, what):
        if isinstance(key, (list, tuple)):
            if not isinstance(value, (list, tuple)) or len(value) != len(key):
                raise ValueError("%s: %d keys need a list of %d values" % (what, len(key), len(key)))
            return list(zip(key, value))
        return [(key, value)]

    def _grouped(self, key, value, what):
        """[(name, int key, [values given it])] in the order of first appearance."""
        groups = {}
        for name, v in self._pairs(key, value, what):
            ikey = self._key(name, create=False)
            if ikey not in groups:
                groups[ikey] = (name, ikey, [])
            groups[ikey][2].append(v)
        return list(groups.values())

    def _checked_shape(self, name, ikey, shape, what):
        """Raises unless an array of `shape` fits key `ikey`: the shape it was
        initialized with here, or flat (ndim 0 or 1) with as many elements."""
        size = self._sizes.get(ikey)
        if size is None:
            raise KeyError("%s: key %r was never initialized (init it first)" % (what, name))
        shape = tuple(int(d) for d in shape)
        n = int(np.prod(shape, dtype=np.int64))
        if n != size:
            raise ValueError("%s of key %r: %d elements, but it was initialized with %d"
                             % (what, name, n, size))
        if len(shape) > 1 and shape != self._shapes[ikey]:
            raise ValueError("%s of key %r: shape %s, but it was initialized with shape %s"
                             % (what, name, shape, self._shapes[ikey]))

    def _pushed(self, name, ikey, values, what):
        """The float32 array a push of `values` (each an array or a list of arrays)
        sends, and the compression residuals to keep once it is applied (None
        unless a device store compresses)."""
        vals = [_source(v, "%s of key %r" % (what, name)) for value in values
                for v in _devices(value)]
        for v in vals[1:]:
            if v.size != vals[0].size:
                raise ValueError("%s of key %r: the arrays to sum differ in size (%d, %d)"
                                 % (what, name, vals[0].size, v.size))
        for v in vals:
            self._checked_shape(name, ikey, v.shape, what)
        residuals = None
        if self._client is None and self._gc_threshold is not None:
            vals, residuals = self._quantized(ikey, vals)
            bad = [j for j, q in enumerate(vals) if not np.isfinite(q).all()]
            if bad:
                # Its residual would stay NaN or Inf, and every later push of
                # the key with it (the dist client refuses such a push too).
                raise Error("FailedPrecondition: %s of key %r: the gradient of device %d "
                            "(plus its 2-bit compression residual) holds NaN or Inf, which "
                            "compression cannot send (the weights were left as they were)"
                            % (what, name, bad[0]))
        total = vals[0] if len(vals) == 1 else np.sum(np.stack([v.ravel() for v in vals]), axis=0)
        return total, residuals

    def _quantized(self, ikey, vals):
        """A device store's compression: each device value's 2-bit round trip
        (a copy; the caller's array stays as it is) with its own residual,
        moved in a copy that the push keeps only once it is applied (a push
        refused leaves the residuals as they were)."""
        old = self._residuals.get(ikey, [])
        out, residuals = [], []
        for j, v in enumerate(vals):
            q = np.array(v, dtype=np.float32, order="C").ravel()
            r = old[j].copy() if j < len(old) else np.zeros(q.size, np.float32)
            _pstrain.quantize_2bit(q, r, self._gc_threshold)
            out.append(q)
            residuals.append(r)
        return out, residuals + old[len(vals):]

    # ---- data ----
    def init(self, key, value):
        """Initializes keys: worker rank 0's values become everyone's. Blocks.

        Every worker calls it (MXNet's protocol: rank 0 sends, then every
        worker passes a barrier).
        """
        pairs = self._pairs(key, value, "init")
        items = []
        for name, v in pairs:
            arr = _source(_devices(v)[0], "init value of key %r" % (name,))
            if arr.size == 0:
                raise ValueError("init of key %r: the value is empty (shape %s); a key holds "
                                 "at least one element" % (name, arr.shape))
            items.append((name, arr))
        seen = set()
        for i, (name, arr) in enumerate(items):
            ikey = self._key(name, create=True)
            if ikey in self._sizes or ikey in seen:
                raise ValueError("init: duplicate init of key %r" % (name,))
            seen.add(ikey)
            items[i] = (ikey, arr)
        for ikey, arr in items:
            self._sizes[ikey] = arr.size
            self._shapes[ikey] = arr.shape
        if self._client is None:
            for ikey, arr in items:
                self._values[ikey] = arr.ravel().copy()
            return
        handles = [self._issue(self._client.init([ikey], [arr.size], arr), [arr], [])
                   for ikey, arr in items]
        for h in handles:
            h.wait()
        self.barrier()

    def push(self, key, value, priority=0):
        """Pushes values (gradients): returns a Handle. Higher priority leaves first."""
        handles = []
        for name, ikey, vs in self._grouped(key, value, "push"):
            arr, residuals = self._pushed(name, ikey, vs, "push")
            if self._client is None:
                self._local_push(ikey, arr, residuals)
                continue
            # The caller's objects too: a PyTorch gradient whose tensor is still
            # referenced is not taken over (and later changed) by autograd.
            h = self._issue(self._client.push([ikey], [arr.size], arr, int(priority)),
                            [arr] + vs, [])
            self._note_push(ikey, h)
            handles.append(h)
        return self._combine(handles)

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        """Pulls current values into ``out`` (an array, or a list per key): returns a Handle.

        A pull sees every push of the key this worker made before it (in
        dist_sync, the round that push belongs to); its ``wait()`` raises the
        error of such a push that failed unseen. ``ignore_sparse`` is MXNet's
        (it skips row-sparse outputs): every value here is dense, so it
        changes nothing.
        """
        if out is None:
            raise ValueError("pull: out= is required (the arrays to pull into)")
        handles = []
        for name, ikey, os_ in self._grouped(key, out, "pull"):
            outs = [x for o in os_ for x in _as_list(o)]
            first, copy_back = _dest(outs[0], "pull output of key %r" % (name,))
            self._checked_shape(name, ikey, first.shape, "pull")
            after = _outputs_after(name, "pull", "the key", first, copy_back, outs[1:])
            for o in outs[1:]:
                self._checked_shape(name, ikey, o.shape, "pull")
            if self._client is None:
                np.copyto(first.reshape(-1), self._values[ikey])
                for f in after:
                    f()
                continue
            # The pushes it comes after are read before it is sent: a push
            # of the key by another thread meanwhile comes after it.
            earlier = self._pushes_before(ikey)
            handles.append(self._issue(self._client.pull([ikey], [first.size], first,
                                                         int(priority)), [first] + outs, after,
                                       earlier))
        return self._combine(handles)

    def pushpull(self, key, value, out=None, priority=0):
        """Pushes ``value`` and receives the updated values into ``out`` (default:
        ``value`` itself) in one round trip: returns a Handle."""
        if out is None:
            out = value
        handles = []
        outs = {ikey: os_ for _, ikey, os_ in self._grouped(key, out, "pushpull")}
        for name, ikey, vs in self._grouped(key, value, "pushpull"):
            arr, residuals = self._pushed(name, ikey, vs, "pushpull")
            dests = [x for o in outs[ikey] for x in _as_list(o)]
            first, copy_back = _dest(dests[0], "pushpull output of key %r" % (name,))
            if first.size != arr.size:
                raise ValueError("pushpull of key %r: output has %d elements, value %d"
                                 % (name, first.size, arr.size))
            after = _outputs_after(name, "pushpull", "the value", first, copy_back, dests[1:])
            for o in dests:
                self._checked_shape(name, ikey, o.shape, "pushpull output")
            if self._client is None:
                self._local_push(ikey, arr, residuals)
                np.copyto(first.reshape(-1), self._values[ikey])
                for f in after:
                    f()
                continue
            earlier = self._pushes_before(ikey)
            h = self._issue(self._client.pushpull([ikey], [arr.size], arr, first, int(priority)),
                            [arr, first] + vs + dests, after, earlier)
            self._note_push(ikey, h)
            handles.append(h)
        return self._combine(handles)

    def broadcast(self, key, value, out, priority=0):
        """init + pull (MXNet 1.x): every worker ends with rank 0's ``value`` in ``out``."""
        self.init(key, value)
        return self.pull(key, out=out, priority=priority)

    def _rebroadcast(self, keys, values):
        """broadcast(keys, values, out=values), where keys broadcast before get
        rank 0's new values: the servers hold one copy per key however often
        it runs. Every worker calls it with the same keys (callers derive them
        from rank 0's sizes: a key keeps its size), which nobody pushes (a
        replace needs the key's round closed). Two barriers on every worker,
        whatever it knows; a worker whose size differs from rank 0's has its
        pull refused by the servers. Blocks.
        """
        if len(set(keys)) != len(keys):
            raise ValueError("broadcast: a key appears more than once in %r" % (list(keys),))
        items = []
        for name, v in zip(keys, values):
            arr = _source(v, "broadcast value of key %r" % (name,))
            if arr.size == 0:
                raise ValueError("broadcast of key %r: the value is empty" % (name,))
            again = self._initialized(name)
            if again and self.rank == 0 and self._sizes[self._str_keys[name]] != arr.size:
                raise ValueError("broadcast of key %r: %d elements, but it was broadcast with %d "
                                 "before (a key keeps its size)"
                                 % (name, arr.size, self._sizes[self._str_keys[name]]))
            items.append((self._key(name, create=True), arr, again))
        for ikey, arr, _ in items:
            self._sizes[ikey] = arr.size
            self._shapes[ikey] = arr.shape
        if self._client is None:
            for ikey, arr, _ in items:
                self._values[ikey] = arr.ravel().copy()
            return  # the values are rank 0's already
        self.barrier()  # every worker has its earlier values: they may go
        if self.rank == 0:
            handles = [self._issue((self._client.replace if again else self._client.init)(
                [ikey], [arr.size], arr), [arr], []) for ikey, arr, again in items]
            for h in handles:
                h.wait()
        self.barrier()
        if self.rank != 0:  # rank 0 holds what it sent
            self.pull(list(keys), out=list(values)).wait()

    def _broadcast_bytes(self, name, data):
        """Rank 0's ``data`` (bytes) on every worker, returned as a memoryview:
        its length, then its bytes as float32 words, which the servers store
        and return as they are (nothing computes on them). Every worker calls
        it with the same ``name`` (its keys: ``name``/bytes and
        ``name``/<words>, a power of two). Blocks.
        """
        data = bytes(data) if self.rank == 0 else b""
        size = np.array([len(data)], dtype=np.uint64)
        self._rebroadcast([name + "/bytes"], [size.view(np.float32)])
        size = int(size[0])
        # A key per power-of-two size class (of at least 1 KiB): objects of
        # lengths that drift (an lr printed with more digits) share one.
        words = np.zeros(max(256, 1 << max(0, (size + 3) // 4 - 1).bit_length()),
                         dtype=np.uint32)
        words.view(np.uint8)[:len(data)] = np.frombuffer(data, dtype=np.uint8)
        self._rebroadcast(["%s/%d" % (name, words.size)], [words.view(np.float32)])
        return memoryview(words.view(np.uint8))[:size]

    def _allreduce(self, name, value):
        """Horovod's allreduce over the servers: the sum of every worker's
        ``value`` (converted to float32), as a new float32 array of its shape.
        Every worker calls it with the same ``name`` in the same order, each
        name keeping its shape; the name's key is initialized by the first
        call (a barrier), later calls are one round trip. The servers store
        the round's sum, whatever optimizer they run (dist_sync only: async
        has no rounds). A local or device store holds one worker: its value.
        Blocks.
        """
        handle, out = self._allreduce_async(name, value)
        if handle is not None:
            handle.wait()
        return out

    def _allreduce_async(self, name, value):
        """``_allreduce`` without waiting for the exchange: (a Handle, or None
        when there is nothing to wait for; the array the sum lands in once
        the handle's wait() returned). The first call of a name still passes
        the init's barrier."""
        arr = _source(value, "allreduce value of %r" % (name,))
        if arr.size == 0:
            raise ValueError("allreduce of %r: the value is empty" % (name,))
        out = np.empty(arr.shape, np.float32)
        if self._client is None:
            np.copyto(out, arr)
            return None, out
        if not self._sync:
            raise Error("FailedPrecondition: allreduce of %r: a %s store's servers apply each "
                        "push at once; allreduce needs the rounds of dist_sync" % (name, self.type))
        if not self._initialized(name):
            self.init(name, np.zeros(arr.shape, np.float32))
        ikey = self._key(name, create=False)
        self._checked_shape(name, ikey, arr.shape, "allreduce")
        return self._issue(self._client.allreduce([ikey], [arr.size], arr, out, 0), [arr, out],
                           []), out

    def waitall(self):
        """Waits for every request this store has in flight; raises the first error
        of a failed request that no ``wait()`` raised (once: the next call does not)."""
        for h in self._pending_handles():
            h._settle()
        self._raise_unreported()

    # ---- internals ----
    def _local_push(self, ikey, arr, residuals=None):
        stored = self._values[ikey]
        if self._py_updater is not None:
            shape = self._shapes[ikey]
            name = self._str_names[ikey] if self._key_kind == "str" else ikey
            pushed = arr.reshape(shape).view()
            pushed.flags.writeable = False  # it may be the caller's own array
            self._py_updater(name, pushed, stored.reshape(shape))
        elif self._updater is not None:
            self._updater.update(ikey, arr.ravel(), stored)
        else:
            np.copyto(stored, arr.ravel())
        if residuals is not None:
            self._residuals[ikey] = residuals

    def _issue(self, completion, keep, after, earlier=()):
        h = Handle(self, [completion], keep, after, earlier)
        with self._lock:
            self._pending[id(h)] = h
            sweep = len(self._pending) > 1024
        if sweep:
            self._settle_answered()
        return h

    def _settle_answered(self):
        """Settles the requests already answered, waiting for none: nobody may
        wait for them (a failed one's error waits in _failed for waitall,
        barrier or close)."""
        for p in self._pending_handles():
            if p.done():
                p._settle()

    def _pushes_before(self, ikey):
        """The push and pushpull handles of `ikey` that a pull issued now comes
        after: those not known to have succeeded, less failed ones already seen."""
        with self._lock:
            return self._pushes_before_locked(ikey)

    def _pushes_before_locked(self, ikey):
        hs = [h for h in self._pushes.get(ikey, ())
              if not h._finished and not (h._error is not None and h._reported)]
        if hs:
            self._pushes[ikey] = hs
        else:
            self._pushes.pop(ikey, None)
        return list(hs)

    def _note_push(self, ikey, h):
        with self._lock:
            self._pushes[ikey] = self._pushes_before_locked(ikey) + [h]

    def _take_unreported(self, handles):
        """The first error among `handles` that nobody has seen, now seen; or None."""
        with self._lock:
            for h in handles:
                if h._error is not None and not h._reported:
                    h._reported = True
                    return h._error
        return None

    def _pending_handles(self):
        with self._lock:
            return list(self._pending.values())

    def _combine(self, handles):
        if len(handles) == 1:
            return handles[0]
        return _Group(self, handles)

    def _forget(self, h):
        with self._lock:
            self._pending.pop(id(h), None)

    def _abandon(self, h):
        with self._lock:
            self._pending.pop(id(h), None)
            self._failed.append(h)

    def _unreported_error(self):
        """The first error of a failed request that no wait() raised; every
        failed request counts as reported from then on."""
        with self._lock:
            error = next((h._error for h in self._failed if not h._reported), None)
            for h in self._failed:
                h._reported = True
        return error

    def _raise_unreported(self):
        error = self._unreported_error()
        if error is not None:
            raise error


def _launched_client(kvtype):
    """The C++ client of a worker of the job the launcher started; a process
    not started by it (no DMLC_* variables) gets an error saying how to start it."""
    try:
        return _pstrain.Client()
    except Error as e:
        if "DMLC_" not in str(e) or "not set" not in str(e):
            raise
        script = sys.argv[0] if sys.argv and sys.argv[0].endswith(".py") else "script.py"
        raise Error("%s: a %r KVStore is a worker of a job whose scheduler and servers the "
                    "launcher starts (it sets the DMLC_* variables): run `pstrain launch -n W "
                    "-s S -- python3 %s` (W workers, S servers; -n 1 -s 1 for one worker); "
                    "a single process without servers can use a 'local' KVStore instead "
                    "(pstrain.torch's DistributedOptimizer needs the servers)"
                    % (e, kvtype, script)) from None


def _whole(x):
    """A count read from a file: an int in [0, 2^63), else ValueError."""
    if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < 2**63:
        raise ValueError("%r is not a count" % (x,))
    return x


def create(name="local"):
    """MXNet's ``mx.kv.create``: a :class:`KVStore` of type ``name``."""
    if not isinstance(name, str):
        raise TypeError("create takes the store's type name (a str), got %r" % (name,))
    return KVStore(name)


class _Group(Handle):
    """Several requests (one per key) waited for as one."""

    def __init__(self, store, handles):
        super().__init__(store, [], None, [])
        self._handles = handles

    def done(self):
        return all(h.done() for h in self._handles)

    def done_at(self):
        times = [h.done_at() for h in self._handles]
        return max(times) if times and not any(math.isnan(t) for t in times) else float("nan")

    def _take_error(self):
        # The first error only is taken (counted as seen): the others stay for
        # waitall, barrier or close to raise.
        for h in self._handles:
            e = h._take_error()
            if e is not None:
                return e
        return None

    def _settle(self, timeout=None):
        # The caller's timeout bounds the whole group's wait, not each handle's.
        end = None if timeout is None else time.monotonic() + max(0.0, timeout)
        for h in self._handles:
            h._settle(None if end is None else max(0.0, end - time.monotonic()))
        with self._lock:
            self._error = next((h._error for h in self._handles if h._error is not None), None)
            self._finished = self._error is None


# What the main thread last passed to sys.exit, and the store calls made by
# then. An exit handler cannot see the process's exit code, and SystemExit
# sets no sys.last_value: without this, a worker that called sys.exit(3)
# mid-training closed its store as a finished worker and waited for the job's
# end, while the other workers waited for its gradients (the job hung until a
# timeout). A sys.exit that was caught and followed by more store calls does
# not count. Not seen: `raise SystemExit(3)`, exit() and quit(), and a
# `from sys import exit` made before pstrain was imported (inside `with kv:`
# each fails the job too; outside, the worker counts as finished, and a
# dist_sync round or barrier that then waits for it ends the job at once).
_exit_status = []
_store_calls = [0]
_sys_exit = sys.exit


def _noting_exit(status=None):
    if threading.current_thread() is threading.main_thread():
        _exit_status[:] = [status, _store_calls[0]]
    _sys_exit(status)


_noting_exit.__doc__ = _sys_exit.__doc__
sys.exit = _noting_exit


def _interactive():
    """Whether an interactive prompt ran (python -i, the REPL, IPython): it
    printed the errors it caught (sys.last_value) and the session went on."""
    if hasattr(sys, "ps1") or sys.flags.interactive:
        return True
    ipython = sys.modules.get("IPython")
    return ipython is not None and getattr(ipython, "get_ipython", lambda: None)() is not None


def _close_at_exit():
    # The script died of this exception (at a prompt: an error it printed).
    failure = None if _interactive() else getattr(sys, "last_value", None)
    status = None
    if _exit_status and _exit_status[1] == _store_calls[0]:
        status = _exit_status[0]
    for kv in list(_OPEN):
        if kv._closed:
            continue
        if failure is not None:
            kv._fail("the worker's script raised %s: %s" % (type(failure).__name__, failure))
            continue
        if status is not None and status != 0:
            kv._fail("the worker's script called sys.exit(%r)" % (status,))
            continue
        try:
            kv.close()
        except BaseException as e:  # an exit handler's exception would only be printed
            # Not a pstrain.Error (a failed copy into an array, Ctrl-C): the
            # store is not closed yet; end this worker's part as failed.
            what = "%s" % (e,) if isinstance(e, Error) else \
                "closing the KVStore at exit failed: %s: %s" % (type(e).__name__, e)
            kv._fail(what)
            sys.stdout.flush()
            print("pstrain: %s" % (what,), file=sys.stderr)
            sys.stderr.flush()
            os._exit(1)


atexit.register(_close_at_exit)
