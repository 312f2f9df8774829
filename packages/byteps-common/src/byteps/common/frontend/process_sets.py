"""Horovod's process sets: collectives among a subset of the ranks.

A :class:`ProcessSet` names some global ranks. Registered (``init(process_sets=...)``
or :func:`add_process_set`, which every rank calls in the same order, as in
Horovod), it gets an id, and ``process_set=`` on any collective runs that
collective among its ranks only: ranks outside it neither take part nor are
waited for. The job's own set, :data:`global_process_set` (id 0), holds
every rank. byteps needs no switch to add sets after init (Horovod's
``HOROVOD_DYNAMIC_PROCESS_SETS``): they can always be added and removed.

Ids count up from 1 in the order sets are added and are never reused, so
every rank that adds and removes the same sets in the same order agrees on
them; a set's tensors live under its id (see
:meth:`byteps.common.worker.Worker.push_pull_async`'s ``members``).

Example::

    evens = hvd.add_process_set([0, 2])
    if evens.included():
        hvd.allreduce(x, name="x", process_set=evens)   # ranks 0 and 2 only
    hvd.remove_process_set(evens)
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Dict, List, Optional, Sequence

from byteps.common import api
from byteps.common.frontend.checks import check_root
from byteps.common.frontend.collectives import RankView
from byteps.common.frontend.reductions import OpSpec, average_of

__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set", "rank_view",
           "register_initial", "reset", "reduction_spec", "broadcast_spec", "broadcast_view"]


class ProcessSet:
    """Some global ranks that run collectives together (sorted; registered when ``process_set_id`` is set)."""

    def __init__(self, ranks: Sequence[int]) -> None:
        try:
            listed = sorted(ranks)
        except TypeError:
            raise ValueError(f"a ProcessSet is built from a list of ranks, got {ranks!r} "
                             "(byteps has no MPI communicators)") from None
        if any(isinstance(r, bool) or not isinstance(r, int) for r in listed):
            raise ValueError(f"a ProcessSet's ranks must be integers, got {listed!r}")
        if len(set(listed)) != len(listed):
            raise ValueError(f"a ProcessSet lists each rank once, got {listed!r}")
        self.ranks: List[int] = listed
        self.process_set_id: Optional[int] = None

    def size(self) -> Optional[int]:
        """Number of ranks in the set; None until it is registered."""
        if self.process_set_id is None:
            return None
        return api.size() if self.process_set_id == 0 else len(self.ranks)

    def rank(self) -> Optional[int]:
        """This process's position in the set; None until registered (ValueError if it is not in the set)."""
        if self.process_set_id is None:
            return None
        return rank_view(self).position

    def included(self) -> Optional[bool]:
        """Whether this process is in the set."""
        if self.process_set_id == 0:
            return True
        return api.rank() in self.ranks

    def _invalidate(self) -> None:
        self.process_set_id = None

    def __str__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

_lock = threading.Lock()
_ids = itertools.count(1)
_registered: Dict[int, ProcessSet] = {}


def _check_ranks(ranks: Sequence[int]) -> None:
    size = api.size()
    outside = [r for r in ranks if not 0 <= r < size]
    if outside:
        raise ValueError(f"process set {list(ranks)}: ranks {outside} are not ranks of this job (0..{size - 1})")
    if not ranks:
        raise ValueError("a process set needs at least one rank")


def add_process_set(process_set: Any) -> ProcessSet:
    """Register a set of ranks (a ProcessSet or a list of ranks) and return it; every rank calls this alike."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    _check_ranks(process_set.ranks)
    with _lock:
        if process_set.ranks == list(range(api.size())) or \
                any(known.ranks == process_set.ranks for known in _registered.values()):
            raise ValueError(f"a process set with ranks {process_set.ranks} exists already")
        process_set.process_set_id = next(_ids)
        _registered[process_set.process_set_id] = process_set
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a set; False for the global set or one that is not registered."""
    with _lock:
        if process_set.process_set_id in (None, 0) or _registered.get(process_set.process_set_id) is not process_set:
            return False
        del _registered[process_set.process_set_id]
    process_set._invalidate()
    return True


def register_initial(process_sets: Optional[Sequence[ProcessSet]]) -> None:
    """The sets passed to ``init(process_sets=...)``, registered in order."""
    for process_set in process_sets or ():
        add_process_set(process_set)


def reset() -> None:
    """Forget every set (at shutdown: a new init starts with none, as in Horovod)."""
    global _ids
    with _lock:
        for process_set in _registered.values():
            process_set._invalidate()
        _registered.clear()
        _ids = itertools.count(1)


def rank_view(process_set: Any) -> RankView:
    """Who takes part in a collective over ``process_set`` (None: every rank), and where this rank stands."""
    if process_set is None or process_set is global_process_set or \
            (isinstance(process_set, ProcessSet) and process_set.process_set_id == 0):
        return RankView.everyone()
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"process_set must be a ProcessSet, got {type(process_set).__name__}")
    with _lock:
        known = process_set.process_set_id is not None and _registered.get(process_set.process_set_id) is process_set
    if not known:
        raise ValueError(f"{process_set} is not registered: add it with add_process_set() (or init(process_sets=...)) "
                         "on every rank first")
    me = api.rank()
    if me not in process_set.ranks:
        raise ValueError(f"rank {me} is not in {process_set}: only its ranks may run its collectives")
    return RankView(tuple(process_set.ranks), process_set.ranks.index(me), process_set.process_set_id)


def reduction_spec(family: str, name: Optional[str], op: Optional[int], average: Optional[bool],
                   prescale: float = 1.0, postscale: float = 1.0, process_set: Any = None,
                   priority: int = 0) -> OpSpec:
    """What an allreduce over ``process_set`` (None: every rank) asks of the servers, in every adapter."""
    view = rank_view(process_set)
    return OpSpec(family, name, average_of(op, average), prescale, postscale, priority,
                  members=None if view.set_id == 0 else view.ranks, set_id=view.set_id)


def broadcast_view(root_rank: Any, process_set: Any, what: str = "broadcast") -> RankView:
    """The ranks of a broadcast from ``root_rank`` over ``process_set``, once the root is checked: a rank of the
    job, and one of the set's (every adapter's broadcasts and ``broadcast_object``)."""
    check_root(root_rank, api.size())
    view = rank_view(process_set)
    if root_rank not in view.ranks:
        raise ValueError(f"{what}: root_rank {root_rank} is not in {process_set}")
    return view


def broadcast_spec(root_rank: Any, name: Optional[str], process_set: Any = None, priority: int = 0) -> OpSpec:
    """A broadcast from ``root_rank`` over ``process_set``: the root is checked here, and again by the servers,
    which fail the op on every rank when ranks name different roots."""
    view = broadcast_view(root_rank, process_set)
    return OpSpec("broadcast", name, average=False, priority=priority,
                  members=None if view.set_id == 0 else view.ranks, set_id=view.set_id, root=int(root_rank))
