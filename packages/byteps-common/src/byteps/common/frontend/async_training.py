"""BytePS's asynchronous training (BYTEPS_ENABLE_ASYNC=1), written once for every adapter.

Each worker steps its own optimizer on its own gradients; then, for every
parameter, it pushes the change its step made (new - old) and pulls the
servers' parameters, which replace its own. The servers keep the
parameters: they begin as rank 0's initial values (a broadcast into their
store, the first exchange of each parameter) and add every worker's delta
as it arrives, waiting for no one (docs/async.md). A pull returns the store
after this worker's own delta and whatever other workers' deltas came
before it; with BYTEPS_ASYNC_MAX_STALENESS=s it waits until the slowest
worker is at most s steps behind.

An adapter's DistributedOptimizer (or trainer) does, around its local step::

    exchange = ParameterExchange(names, Snapshots(copy=..., subtract=..., zeros_like=...),
                                 at_commit=lambda: exchange.pull(live_tensors()))
    exchange.start(tensors)                 # once per job: the servers' store from rank 0's values
    before = exchange.snapshot(tensors)
    local_optimizer_step()
    exchange.exchange(before, tensors)      # deltas out, the servers' parameters into ``tensors``

``tensors`` maps each name to a buffer byteps reads and writes in place (a
numpy array, a CPU torch tensor); every rank passes the same names in the
same order.

Elastic training (docs/elastic.md, "Asynchronous training"): an exchange
belongs to the job it started in. Each membership epoch is a new job with
fresh servers whose stores are empty, so there ``start()`` broadcasts rank
0's parameters again (as they stand after ``state.sync()``). At every
``state.commit()`` the elastic State calls :func:`commit_exchanges`: every
rank takes the servers' store, which then holds every delta pushed before
the commit, so what is committed is the same on every rank and includes
each of those deltas once.
"""

from __future__ import annotations

import dataclasses
import inspect
import weakref
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

from byteps.common import api
from byteps.common.options import PushPullOptions

__all__ = ["ASYNC_PREFIX", "Snapshots", "ParameterExchange", "async_enabled", "check_async_compression",
           "commit_exchanges"]

#: Prefix of every parameter's asynchronous exchange, apart from gradients ("Gradient.") and broadcasts.
ASYNC_PREFIX = "AsyncParameter."
#: The name of the (synchronous) sums that serve commit_exchanges() as barriers.
COMMIT_BARRIER = "ParameterExchange.commit"


def async_enabled() -> bool:
    """Whether this process trains asynchronously (BYTEPS_ENABLE_ASYNC=1; byteps must be initialized)."""
    return api.worker().config.enable_async


def check_async_compression(compression_params: Any, compression_is_none: bool = True) -> None:
    """Asynchronous training exchanges parameter deltas uncompressed: refuse compression, naming both."""
    if compression_params or not compression_is_none:
        raise ValueError("BYTEPS_ENABLE_ASYNC=1 exchanges parameter deltas uncompressed: drop compression "
                         "(compression_params / compression=) or unset BYTEPS_ENABLE_ASYNC")


@dataclasses.dataclass(frozen=True)
class Snapshots:
    """The three tensor operations an adapter lends the exchange, in its framework."""

    copy: Callable[[Any], Any]  # a new tensor equal to the given one
    subtract: Callable[[Any, Any], Any]  # a new tensor: first - second
    zeros_like: Callable[[Any], Any]


class ParameterExchange:
    """One optimizer's parameters in asynchronous training: the initial broadcast, then a delta per step.

    ``at_commit`` is what its owner does at an elastic ``state.commit()``
    (:func:`commit_exchanges`): push what it has not pushed yet, if
    anything, and leave the servers' parameters where the parameters live,
    e.g. ``lambda: exchange.pull(live_tensors())`` for an optimizer that
    exchanges within its step. It returns True when it pushed a change of
    its own (a gradient tape's last update): the others may have pulled
    before that push arrived, so it is called once more, after a barrier,
    with nothing left to push. An exchange without one cannot take part in
    elastic training's commits. A bound method is held
    weakly: its object (an optimizer) owns the exchange, so no cycle keeps
    a dropped optimizer alive until the garbage collector runs, at another
    moment on each rank; once the object is gone, commits leave its
    parameters alone.
    """

    def __init__(self, names: Sequence[str], ops: Snapshots,
                 at_commit: Optional[Callable[[], Optional[bool]]] = None) -> None:
        if len(set(names)) != len(names):
            raise ValueError("asynchronous training needs unique parameter names")
        self.names: List[str] = list(names)
        self.ops = ops
        self.takes_commits = at_commit is not None
        self._at_commit: Callable[[], Optional[Callable[[], Optional[bool]]]] = (
            weakref.WeakMethod(at_commit) if inspect.ismethod(at_commit) else lambda: at_commit)
        self.steps = 0  # exchanges done since start() in this job (the servers' round of each parameter)
        # The Worker whose servers hold this exchange's store; weak, so a job left behind is not kept alive.
        self._job: Optional[weakref.ref] = None

    @property
    def at_commit(self) -> Optional[Callable[[], Optional[bool]]]:
        """What to call at an elastic commit; None without one, or once the object that gave it is gone."""
        return self._at_commit()

    @property
    def started(self) -> bool:
        """Whether the current job's servers hold this exchange's store (start() ran in this job).

        False again in an elastic job's next membership epoch: a new Worker,
        whose servers start empty.
        """
        return self._job is not None and api.is_initialized() and self._job() is api.worker()

    def start(self, tensors: Mapping[str, Any]) -> None:
        """Once per job, before its first step: rank 0's values become the servers' store, and every rank's."""
        if self.started:
            return
        worker = api.worker()
        pending = []
        for name in self.names:
            tensor = tensors[name]
            source = tensor if worker.rank == 0 else self.ops.zeros_like(tensor)
            pending.append((source, worker.push_pull_async(source, ASYNC_PREFIX + name, PushPullOptions(
                average=False, output=tensor, root=0, asynchronous=True))))
        self._wait(pending)
        self._job = weakref.ref(worker)
        self.steps = 0
        _started_in_order(self)

    def snapshot(self, tensors: Mapping[str, Any]) -> Dict[str, Any]:
        """Copies of the parameters as they are before the local step."""
        return {name: self.ops.copy(tensors[name]) for name in self.names}

    def exchange(self, before: Mapping[str, Any], tensors: Mapping[str, Any]) -> None:
        """Push each parameter's change since ``before``; leave the servers' parameters in ``tensors``."""
        worker = api.worker()
        if not self.started:
            raise RuntimeError("ParameterExchange.exchange() before start() in this job (after a change of "
                               "membership the next epoch's servers start empty: start() again)")
        pending = []
        for name in self.names:
            delta = self.ops.subtract(tensors[name], before[name])
            pending.append((delta, worker.push_pull_async(delta, ASYNC_PREFIX + name, PushPullOptions(
                average=False, output=tensors[name], asynchronous=True))))
        self._wait(pending)
        self.steps += 1

    def pull(self, tensors: Mapping[str, Any]) -> None:
        """The servers' parameters into ``tensors``, through an exchange of a zero change (a push the servers
        count, adding nothing)."""
        self.exchange(self.snapshot(tensors), tensors)

    @staticmethod
    def _wait(pending: List[Any]) -> None:
        error: Optional[BaseException] = None
        for _, handle in pending:  # every handle, even after a failure: none is left writing into a tensor
            try:
                handle.wait()
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                error = error or exc
        if error is not None:
            raise error


# Every exchange this process started, in the order of its latest start(). Starts are collectives
# that every rank makes in the same order, so the exchanges started in the current job come in the
# same order on every rank, which commit_exchanges() relies on.
_started: List[weakref.ref] = []


def _started_in_order(exchange: ParameterExchange) -> None:
    global _started
    _started = [ref for ref in _started if ref() is not None and ref() is not exchange] + [weakref.ref(exchange)]


def commit_exchanges() -> None:
    """At an elastic ``state.commit()``: every rank's parameters become the servers' store, the same everywhere.

    Nothing to do (and nothing sent) unless an exchange started in the
    current job. Else: a barrier, so every rank has finished its last
    exchange (a worker's push is applied before its pull is answered, so
    the store holds every delta pushed before the commit); then each
    exchange's ``at_commit`` (a zero change out, the store in). An
    exchange whose ``at_commit`` pushed a change of its own takes the store
    again after another barrier, once every rank's push has arrived. Then a
    barrier again, so no rank pushes its next delta before every rank has
    pulled. Every rank exchanges as often as the others, so a staleness
    bound (BYTEPS_ASYNC_MAX_STALENESS) sees no rank run ahead.

    The barriers are sums over every rank, which wait as long as it takes:
    asynchronous workers may arrive a whole commit interval apart, longer
    than the scheduler's barrier waits (BYTEPS_RENDEZVOUS_TIMEOUT).
    """
    exchanges = [ref() for ref in _started]
    current = [exchange for exchange in exchanges if exchange is not None and exchange.started]
    if not current:
        return
    unable = [exchange.names for exchange in current if not exchange.takes_commits]
    if unable:
        raise RuntimeError(f"asynchronous training: a commit cannot bring parameters {unable[0]} to the servers' "
                           "store: their ParameterExchange was made without at_commit (elastic training with "
                           "BYTEPS_ENABLE_ASYNC=1 is built for byteps.torch, byteps.tensorflow and byteps.common)")
    _all_arrive()
    pushed_own = [exchange for exchange in current if _take_store(exchange)]
    if pushed_own:  # the same exchanges on every rank: whether one pushes is its kind's, not its data's
        _all_arrive()
        for exchange in pushed_own:
            _take_store(exchange)  # nothing left to push: the store holds every rank's change now
    _all_arrive()


def _take_store(exchange: ParameterExchange) -> bool:
    """``exchange``'s at_commit; True when it pushed a change of its own. Nothing when the object that gave it
    is gone (nothing steps those parameters any more)."""
    take_store = exchange.at_commit
    return bool(take_store()) if take_store is not None else False


def _all_arrive() -> None:
    api.push_pull(np.zeros(1, dtype=np.int32), name=COMMIT_BARRIER, average=False)
