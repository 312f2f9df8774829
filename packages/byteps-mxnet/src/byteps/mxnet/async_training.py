"""Asynchronous training (BYTEPS_ENABLE_ASYNC=1) for NDArray parameters: BytePS's semantics in MXNet.

No gradient is averaged. The local optimizer steps on this worker's own
gradients, exactly as a plain gluon ``Trainer`` (or the plain optimizer)
would; then each parameter's change is pushed to the servers, which add it
to the parameters they keep, and the servers' parameters replace this
worker's (:mod:`byteps.common.frontend.async_training`). The first step of
a parameter first broadcasts rank 0's value into the servers' store.

The exchange reads and writes numpy arrays, so every step copies each
parameter to the host before and after the local update and writes the
servers' values back into every context's copy (``arr[:] = value``, which
waits for the array's pending MXNet operations). The training loop
therefore waits for its exchange in ``step()``, unlike a synchronous step,
which queues on MXNet's engine and returns at once.

Example (what :class:`~byteps.mxnet.DistributedTrainer` does inside ``step()``)::

    exchange = ArrayExchange()
    exchange.step({"w": [w]}, lambda: sgd.update(0, w, g, state))    # local step, deltas out, store in
"""

from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Sequence

import mxnet as mx
import numpy as np

from byteps.common import api
from byteps.common.frontend.async_training import ParameterExchange, Snapshots, async_enabled

__all__ = ["ArrayExchange", "HOST_SNAPSHOTS", "asynchronous", "check_master_weights"]

#: The exchange's tensor operations on the numpy copies of the parameters.
HOST_SNAPSHOTS = Snapshots(copy=np.copy, subtract=np.subtract, zeros_like=np.zeros_like)


def asynchronous() -> bool:
    """Whether this process trains asynchronously (byteps initialized and BYTEPS_ENABLE_ASYNC=1)."""
    return api.is_initialized() and async_enabled()


def check_master_weights(optimizer: mx.optimizer.Optimizer, name: str, weight: mx.nd.NDArray) -> None:
    """Refuse float16 weights with ``multi_precision``: their float32 master copy would not see the pull.

    The optimizer keeps that copy in its state and writes the weight from it
    at every update, so the servers' parameters written into the weight
    would be lost at the next step.
    """
    if getattr(optimizer, "multi_precision", False) and np.dtype(weight.dtype) == np.float16:
        raise NotImplementedError(
            f"BYTEPS_ENABLE_ASYNC=1: parameter {name!r} is float16 with multi_precision=True; asynchronous "
            "training replaces the weight, not the optimizer's float32 master copy: train in float32 or drop "
            "multi_precision")


class ArrayExchange:
    """The servers' parameters around local steps, for NDArrays of a trainer or an optimizer.

    Each name belongs to one :class:`ParameterExchange`: :meth:`group` puts
    names in one exchange, whose push_pulls run together (a trainer's
    parameters); a name :meth:`step` meets before any group gets an exchange
    of its own (an optimizer's weights, met one index at a time). Ranks must
    step the same names in the same order. ``ops`` is what new exchanges
    take (a test may wrap it before the first step).
    """

    def __init__(self, ops: Snapshots = HOST_SNAPSHOTS) -> None:
        self.ops = ops
        self._exchanges: Dict[str, ParameterExchange] = {}

    @property
    def names(self) -> List[str]:
        """Every name exchanged so far, in the order they were first met."""
        return list(self._exchanges)

    def group(self, names: Sequence[str]) -> None:
        """One exchange for ``names`` (those not already in one)."""
        new = [name for name in names if name not in self._exchanges]
        if new:
            exchange = ParameterExchange(new, self.ops)
            self._exchanges.update((name, exchange) for name in new)

    def step(self, copies: Mapping[str, Sequence[mx.nd.NDArray]], update: Callable[[], None]) -> None:
        """Run ``update`` (the local step), push each parameter's change and write in the servers' values.

        ``copies`` maps each name to the arrays holding that parameter (one
        per context; the first is read, all are written). A parameter's
        first step starts with rank 0's value, on every rank.
        """
        exchanges = self._exchanges_of(copies)
        for exchange in exchanges:
            if not exchange.started:
                tensors = _host(copies, exchange.names)
                exchange.start(tensors)
                _write_back(copies, tensors)
        before = _host(copies, list(copies))
        update()
        after = _host(copies, list(copies))
        for exchange in exchanges:  # each reads and writes its own names only
            exchange.exchange(before, after)
        _write_back(copies, after)

    def pull(self, copies: Mapping[str, Sequence[mx.nd.NDArray]]) -> None:
        """The servers' parameters into ``copies``, through an exchange of a zero change."""
        self.step(copies, lambda: None)

    def _exchanges_of(self, copies: Mapping[str, Sequence[mx.nd.NDArray]]) -> List[ParameterExchange]:
        found: List[ParameterExchange] = []
        for name in copies:
            if name not in self._exchanges:
                self.group([name])
            exchange = self._exchanges[name]
            if exchange not in found:
                found.append(exchange)
        for exchange in found:
            missing = [name for name in exchange.names if name not in copies]
            if missing:
                raise ValueError(f"asynchronous training: parameters {missing} are exchanged together with "
                                 f"{list(copies)} and must be stepped with them")
        return found


def _host(copies: Mapping[str, Sequence[mx.nd.NDArray]], names: Sequence[str]) -> Dict[str, np.ndarray]:
    # asnumpy waits for the array's pending writes (the update) and returns a copy.
    return {name: copies[name][0].asnumpy() for name in names}


def _write_back(copies: Mapping[str, Sequence[mx.nd.NDArray]], tensors: Mapping[str, np.ndarray]) -> None:
    for name, value in tensors.items():
        for array in copies[name]:
            array[:] = value
