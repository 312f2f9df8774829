"""DistributedOptimizer(op=Adasum): Horovod's Adasum delta optimizer, over byteps' ``allreduce(op=Adasum)``.

No gradient is combined. As soon as a parameter's gradient is ready in
backward (after ``backward_passes_per_step`` passes), this rank steps the
wrapped optimizer on that parameter alone, with its own local gradient,
takes the change the step made (``delta = new - start``), puts the
parameter back to ``start`` and starts an Adasum allreduce of ``delta``
(:mod:`byteps.common.frontend.adasum`: computed by every rank from an
allgather, so all ranks get the same bits). ``step()`` waits for them and
sets every parameter to ``start + adasum(deltas)``. Each rank's optimizer
state (momentum, Adam's moments) follows its own gradients, as in Horovod;
the parameters stay equal on every rank.

Example (``bpslaunch -np 2 -- python train.py``; 1, 2, 4, 8, ... workers)::

    optimizer = bps.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-3),
                                         named_parameters=model.named_parameters(), op=bps.Adasum)
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()   # each parameter steps locally, its delta goes out
        optimizer.step()                  # parameters = start + adasum(deltas)

Since the wrapped optimizer consumes each gradient during backward,
gradients changed after ``backward()`` (clipping, unscaling) no longer
count: ``synchronize()`` has nothing to do and ``skip_synchronize()``
refuses, as in Horovod. With one worker nothing is sent, ``step()`` is
the wrapped optimizer's and ``skip_synchronize()`` does nothing, as
Horovod's plain optimizer, which it returns for one worker.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Dict, List, NamedTuple, Tuple

import torch

from byteps.common import api
from byteps.common.frontend import Adasum
from byteps.common.frontend.async_training import async_enabled
from byteps.common.frontend.process_sets import global_process_set
from byteps.torch.gradient_hooks import hook_gradient
from byteps.torch.horovod_ops import allreduce_async_
from byteps.torch.ops import synchronize

__all__ = ["AdasumDistributedOptimizer", "check_adasum_options"]

#: Prefix of every parameter delta's allreduce name (apart from gradients and broadcasts).
DELTA_PREFIX = "AdasumDelta."


def check_adasum_options(optimizer: torch.optim.Optimizer, compression: Any, sparse_as_dense: bool,
                         process_set: Any, compression_params: Any) -> None:
    """Refuse, at the DistributedOptimizer call, what the Adasum delta optimizer cannot do; each message says
    what to do instead."""
    if not api.is_initialized():
        raise ValueError("DistributedOptimizer(op=Adasum) needs the job's size: call bps.init() first")
    size = api.size()
    if size & (size - 1):
        raise NotImplementedError(f"op=Adasum needs a power-of-two number of workers (as in Horovod), this job has "
                                  f"{size}: run 1, 2, 4, 8, ... workers or use op=Average")
    if api.membership_epoch() is not None:
        raise NotImplementedError("op=Adasum is not supported in elastic jobs (bpslaunch --min-np): use op=Average, "
                                  "or a fixed number of workers")
    if process_set is not global_process_set and process_set is not None:
        raise NotImplementedError("op=Adasum reduces over every worker (as in Horovod): drop process_set, "
                                  "or use op=Average with it")
    if async_enabled():
        raise ValueError("BYTEPS_ENABLE_ASYNC=1 exchanges parameters through the servers, not by Adasum: "
                         "unset BYTEPS_ENABLE_ASYNC or drop op=Adasum")
    if api.worker().config.backup_workers:
        raise ValueError("op=Adasum needs every worker's delta each step, so rounds cannot close without "
                         "backup workers: unset BYTEPS_BACKUP_WORKERS or use op=Average")
    if compression_params:
        raise ValueError("compression_params compresses gradients into the servers' sum; op=Adasum sends no "
                         "gradients: drop compression_params (compression=Compression.fp16 works)")
    if sparse_as_dense:
        raise ValueError("sparse_as_dense has no effect with op=Adasum (the parameter deltas it sends are dense): "
                         "drop sparse_as_dense")
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("op=Adasum steps each parameter alone, LBFGS steps all of them together with a "
                         "closure: use op=Average with LBFGS")
    if not (hasattr(compression, "compress") and hasattr(compression, "decompress")):
        raise ValueError(f"compression must be a Compressor such as Compression.fp16, got {compression!r}")


class _Delta(NamedTuple):
    """One parameter's change in this step, as it is sent, and where the parameter started."""

    buffer: torch.Tensor  # the compressed delta; the Adasum lands here
    ctx: Any              # the compressor's context
    start: torch.Tensor   # the parameter before this step


class AdasumDistributedOptimizer:
    """Mixed in front of the wrapped optimizer's class by :func:`byteps.torch.DistributedOptimizer`."""

    def _setup_adasum(self, named_parameters: List[Tuple[str, torch.Tensor]], compression: Any,
                      backward_passes_per_step: int) -> None:
        names = {id(p): name for name, p in named_parameters}
        self._delta_names: Dict[torch.Tensor, str] = {p: DELTA_PREFIX + names[id(p)]
                                                      for group in self.param_groups for p in group["params"]}
        # Deltas go out in one order on every rank (a collective's first use gives it its id): backward's
        # usual order, last parameter first. One that is ready early waits for those before it.
        self._order = list(reversed(self._delta_names))
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self._passes_left = {p: backward_passes_per_step for p in self._delta_names}
        self._ready: Dict[torch.Tensor, _Delta] = {}          # stepped locally, not sent yet
        self._pending: Dict[torch.Tensor, Tuple[int, _Delta]] = {}  # sent: (handle, delta)
        self._passed = 0                                      # how much of _order is sent (or not to be) this step
        self._communicate = api.size() > 1
        if self._communicate:
            for p in self._delta_names:
                if p.requires_grad:
                    hook_gradient(p, self._gradient_ready)

    def _gradient_ready(self, p: torch.Tensor) -> None:
        if p in self._ready or p in self._pending or self._passes_left[p] == 0:
            raise RuntimeError(
                f"the gradient of {self._delta_names[p][len(DELTA_PREFIX):]!r} was computed more than "
                f"backward_passes_per_step={self.backward_passes_per_step} times before step(); raise "
                "backward_passes_per_step to accumulate gradients locally")
        self._passes_left[p] -= 1
        if self._passes_left[p] == 0:
            self._ready[p] = self._local_delta(p)
            self._send_in_order()

    def _local_delta(self, p: torch.Tensor) -> _Delta:
        """Step the wrapped optimizer on ``p`` alone, put ``p`` back, and return the change the step made."""
        start = p.detach().clone()
        stashed = [group["params"] for group in self.param_groups]
        for group in self.param_groups:
            group["params"] = [p] if any(q is p for q in group["params"]) else []
        try:
            super().step()  # no gradient (unused here): no change, and a zero delta keeps the ranks in step
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params
        with torch.no_grad():
            delta = p.detach() - start
            p.copy_(start)  # the model changes at step(), as with any optimizer
        compressed, ctx = self._compression.compress(delta)
        return _Delta(compressed if compressed.is_contiguous() else compressed.contiguous(), ctx, start)

    def _send_in_order(self, finish: bool = False) -> None:
        """Start the Adasum of every ready delta whose turn it is; with ``finish``, of every one left (stepping
        now the parameters whose passes are not all done or that got no gradient)."""
        while self._passed < len(self._order):
            p = self._order[self._passed]
            if p in self._ready:
                delta = self._ready.pop(p)
            elif not p.requires_grad:
                self._passed += 1  # frozen (alike on every rank): not sent
                continue
            elif finish:
                delta = self._local_delta(p)
            else:
                return
            self._pending[p] = (allreduce_async_(delta.buffer, name=self._delta_names[p], op=Adasum), delta)
            self._passed += 1

    def synchronize(self) -> None:
        """Nothing to do: each gradient was used by the local step during backward (Horovod's Adasum)."""

    def skip_synchronize(self) -> ContextManager[None]:
        """Refused with several workers, as in Horovod: there is no synchronize() to skip. With one worker a
        context that does nothing (Horovod's plain optimizer's)."""
        if not self._communicate:
            return contextlib.nullcontext()
        raise NotImplementedError("skip_synchronize() does not apply with op=Adasum: each rank steps on its own "
                                  "gradients during backward; call step() alone")

    def skip_step(self) -> bool:
        """Never behind: backup workers are refused with op=Adasum, so compute every batch."""
        return False

    def step(self, closure: Any = None) -> Any:
        if not self._communicate:
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        try:
            self._send_in_order(finish=True)
            with torch.no_grad():
                for p, (handle, delta) in self._pending.items():
                    combined = self._compression.decompress(synchronize(handle), delta.ctx)
                    p.copy_(delta.start + combined.to(p.dtype))
        finally:
            self._ready.clear()
            self._pending.clear()
            self._passed = 0
            for p in self._passes_left:
                self._passes_left[p] = self.backward_passes_per_step
        return loss

    step.hooked = True  # type: ignore[attr-defined]

    def zero_grad(self, set_to_none: bool = True) -> None:
        started = any(left != self.backward_passes_per_step for left in self._passes_left.values())
        if self._ready or self._pending or started:
            raise ValueError(
                "optimizer.zero_grad() was called after loss.backward() but before optimizer.step(); the "
                "parameter deltas of this step are pending, and zeroing the gradients now would lose them")
        return super().zero_grad(set_to_none)
