"""DistributedOptimizer in asynchronous training (BYTEPS_ENABLE_ASYNC=1): BytePS's semantics in torch.

No gradient is averaged: ``step()`` runs the wrapped optimizer on this
worker's own gradients, then pushes each parameter's change and takes the
servers' parameters in its place (byteps.common.frontend.async_training,
docs/async.md). The first ``step()`` first broadcasts rank 0's parameters
into the servers' store, and so does the first one in each new membership
epoch of an elastic job; at every ``state.commit()`` the parameters become
the servers' (docs/elastic.md, "Asynchronous training"). The training
script does not change: the same ``bps.DistributedOptimizer(...)`` call
returns this optimizer when the variable is set on every process.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Tuple

import torch

from byteps.common.frontend.async_training import ParameterExchange, Snapshots

__all__ = ["AsyncDistributedOptimizer"]

_SNAPSHOTS = Snapshots(copy=lambda t: t.clone(), subtract=lambda a, b: a - b, zeros_like=torch.zeros_like)


class AsyncDistributedOptimizer:
    """Mixed in front of the wrapped optimizer's class by :func:`byteps.torch.DistributedOptimizer`."""

    def _setup_async(self, named_parameters: List[Tuple[str, torch.Tensor]]) -> None:
        names = {id(p): name for name, p in named_parameters}
        self._async_parameters: List[Tuple[str, torch.Tensor]] = []
        for group in self.param_groups:
            for p in group["params"]:
                # A CUDA parameter goes through pinned host memory partition by partition, as every CUDA
                # push_pull does (docs/gpu.md); its snapshot and delta stay on its device.
                self._async_parameters.append((names[id(p)], p))
        self._exchange = ParameterExchange([name for name, _ in self._async_parameters], _SNAPSHOTS,
                                           at_commit=self._take_store)

    def _tensors(self) -> Dict[str, torch.Tensor]:
        return {name: p.data for name, p in self._async_parameters}

    def step(self, closure: Any = None) -> Any:
        tensors = self._tensors()
        with torch.no_grad():
            self._exchange.start(tensors)
            before = self._exchange.snapshot(tensors)
        loss = super().step(closure)
        with torch.no_grad():
            self._exchange.exchange(before, tensors)
        return loss

    step.hooked = True  # type: ignore[attr-defined]

    def _take_store(self) -> None:
        """At an elastic ``state.commit()``: the servers' parameters, with every delta pushed so far, into ours."""
        with torch.no_grad():
            self._exchange.pull(self._tensors())

    def synchronize(self) -> None:
        """Nothing to wait for: asynchronous training exchanges parameters in ``step()``."""

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        yield
