"""The process-wide calls of every adapter: init, shutdown, size, rank, barrier, join.

All adapters share one byteps-common worker per process, so they share
these functions too. An adapter that keeps state of its own (handles,
tensor names, MXNet's engine bridge) registers what to do around init and
shutdown with :func:`on_init`, :func:`before_shutdown` and
:func:`after_shutdown`.

Example::

    import byteps.common.frontend as front
    front.init()
    front.rank(), front.size()
    front.shutdown()
"""

from __future__ import annotations

import atexit
from typing import Any, Callable, List, Optional, Sequence

import numpy as np

from byteps.common import api
from byteps.common.frontend import names

# What adapters re-export (``from byteps.common.frontend.process import *``); the hooks are for adapters only.
__all__ = ["init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "barrier", "join"]

_on_init: List[Callable[[], None]] = []
_before_shutdown: List[Callable[[], None]] = []
_after_shutdown: List[Callable[[], None]] = []


def on_init(callback: Callable[[], None]) -> None:
    """Run ``callback()`` after every :func:`init` (idempotent callbacks only: init may be called twice)."""
    _on_init.append(callback)


def before_shutdown(callback: Callable[[], None]) -> None:
    """Run ``callback()`` at :func:`shutdown`, before the worker leaves the job."""
    _before_shutdown.append(callback)


def after_shutdown(callback: Callable[[], None]) -> None:
    """Run ``callback()`` at :func:`shutdown`, after the worker has left the job."""
    _after_shutdown.append(callback)


def init(comm: Any = None, process_sets: Optional[Sequence[Any]] = None) -> None:
    r"""Join the job that ``bpslaunch`` describes in the environment. Idempotent.

    ``process_sets`` (:class:`~byteps.common.frontend.process_sets.ProcessSet`\ s)
    are registered in order, as Horovod's ``init(process_sets=...)`` does.
    ``comm`` (an MPI communicator or rank list in Horovod) is not supported:
    byteps has no MPI.
    """
    if comm is not None:
        raise ValueError("init(comm=...): byteps has no MPI; its ranks are the worker processes bpslaunch starts "
                         "(use process sets for subsets)")
    from byteps.common.frontend import process_sets as sets
    api.init()
    api.worker().registry.on_retire(names.forget_retired)
    for callback in _on_init:
        callback()
    sets.register_initial(process_sets)


def shutdown() -> None:
    """Stop byteps in this process; a later init() picks up where it left off (Horovod's re-init).

    Pending handles become invalid. The process stays in the job until it
    exits (or the job's end): see :func:`byteps.common.api.suspend`. In a
    job whose scheduler says so (BytePS's role mode,
    BYTEPS_SHUTDOWN_LEAVES_JOB=1) the process leaves the job here, as in
    BytePS, so the scheduler and servers end once every worker has shut
    down; a later init() then joins a new job.
    """
    from byteps.common.frontend import process_sets as sets
    for callback in _before_shutdown:
        callback()
    if api.is_initialized() and api.worker().shutdown_leaves_job:
        api.shutdown()
    else:
        api.suspend()
    sets.reset()
    for callback in _after_shutdown:
        callback()


def _leave_at_exit() -> None:
    if api.is_initialized():
        shutdown()
    api.shutdown()


# Registered after byteps.common's own exit hook, so it runs before it.
atexit.register(_leave_at_exit)


def is_initialized() -> bool:
    return api.is_initialized()


def size() -> int:
    """Number of worker processes in the job."""
    return api.size()


def rank() -> int:
    """This process's rank, 0 .. size()-1."""
    return api.rank()


def local_size() -> int:
    """Number of worker processes on this machine."""
    return api.local_size()


def local_rank() -> int:
    """This process's rank among the worker processes of its machine."""
    return api.local_rank()


def barrier(process_set: Any = None) -> None:
    """Block until every rank (of ``process_set``, default all) has called barrier()."""
    from byteps.common.frontend.process_sets import rank_view
    view = rank_view(process_set)
    if view.set_id == 0:
        api.barrier()
        return
    view.push_pull("byteps.barrier", np.ones(1, dtype=np.int32))


def join(device: int = -1) -> int:
    """Horovod's join for uneven data: this rank has no more batches. Returns the rank that joined last.

    Until every rank has joined, the ranks still training get this rank's
    tensors as zeros in their allreduces (an average still divides by
    ``size()``), nothing from it in their allgathers, and may not broadcast
    from it; then every rank returns. ``device`` is accepted for Horovod's
    signature and ignored.
    """
    last, states = api.worker().join(names.join_state())
    names.adopt_join_states(states)
    return last
