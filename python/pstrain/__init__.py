"""pstrain from Python: the parameter server's KV store, for NumPy and PyTorch.

Every process of a job runs the same script; ``DMLC_ROLE`` says which role it
plays, as for ``pstrain train`` (and MXNet). Importing this package in
the scheduler or a server runs that role until the job ends and then exits
the process with the role's exit code, so the rest of the script only ever
runs on workers::

    import pstrain                        # scheduler and servers stop here
    kv = pstrain.KVStore("dist_sync")     # or pstrain.kv.create("dist_sync"), as mx.kv
    kv.init(3, numpy.ones(6, numpy.float32))
    kv.push(3, grad).wait()
    kv.pull(3, out=weight).wait()

``pstrain.torch`` trains a PyTorch model through the servers
(``DistributedOptimizer``). Errors from the C++ side are raised as
``pstrain.Error`` (a ``RuntimeError``) with the C++ message.
"""
import signal as _signal
import sys as _sys

from . import _pstrain
from ._pstrain import Error

Error.__module__ = "pstrain"  # raised as pstrain.Error

__all__ = ["Error", "KVStore", "kv", "kvstore", "lr_scheduler", "optimizer", "run_role"]


def run_role():
    """Runs this process's role if DMLC_ROLE says scheduler or server.

    The role runs until the job ends; then the process exits with its exit
    code (0: the job finished). Returns at once on a worker (DMLC_ROLE
    ``worker`` or unset). Importing pstrain calls it.
    """
    if _pstrain.process_role() == "worker":
        return
    # As the pstrain binary: Ctrl-C stops a scheduler or server at once.
    _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
    code = _pstrain.run_role()
    _sys.stdout.flush()
    _sys.stderr.flush()
    raise SystemExit(code)


run_role()

from . import lr_scheduler, optimizer  # noqa: E402  (after the role ran)
from . import kvstore  # noqa: E402
from . import kvstore as kv  # noqa: E402  (MXNet's mx.kv)
from .kvstore import Handle, KVStore  # noqa: E402
