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

    exchange = ParameterExchange(names, Snapshots(copy=..., subtract=..., zeros_like=...))
    exchange.start(tensors)                 # once: the servers' store from rank 0's values
    before = exchange.snapshot(tensors)
    local_optimizer_step()
    exchange.exchange(before, tensors)      # deltas out, the servers' parameters into ``tensors``

``tensors`` maps each name to a buffer byteps reads and writes in place (a
numpy array, a CPU torch tensor); every rank passes the same names in the
same order.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from byteps.common import api
from byteps.common.options import PushPullOptions

__all__ = ["ASYNC_PREFIX", "Snapshots", "ParameterExchange", "async_enabled", "check_async_compression"]

#: Prefix of every parameter's asynchronous exchange, apart from gradients ("Gradient.") and broadcasts.
ASYNC_PREFIX = "AsyncParameter."


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
    """One optimizer's parameters in asynchronous training: the initial broadcast, then a delta per step."""

    def __init__(self, names: Sequence[str], ops: Snapshots) -> None:
        if len(set(names)) != len(names):
            raise ValueError("asynchronous training needs unique parameter names")
        self.names: List[str] = list(names)
        self.ops = ops
        self.started = False
        self.steps = 0  # exchanges done (the servers' round of each parameter, less the broadcast)

    def start(self, tensors: Mapping[str, Any]) -> None:
        """Once, before the first step: rank 0's values become the servers' store, and every rank's."""
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
        self.started = True

    def snapshot(self, tensors: Mapping[str, Any]) -> Dict[str, Any]:
        """Copies of the parameters as they are before the local step."""
        return {name: self.ops.copy(tensors[name]) for name in self.names}

    def exchange(self, before: Mapping[str, Any], tensors: Mapping[str, Any]) -> None:
        """Push each parameter's change since ``before``; leave the servers' parameters in ``tensors``."""
        if not self.started:
            raise RuntimeError("ParameterExchange.exchange() before start()")
        worker = api.worker()
        pending = []
        for name in self.names:
            delta = self.ops.subtract(tensors[name], before[name])
            pending.append((delta, worker.push_pull_async(delta, ASYNC_PREFIX + name, PushPullOptions(
                average=False, output=tensors[name], asynchronous=True))))
        self._wait(pending)
        self.steps += 1

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
