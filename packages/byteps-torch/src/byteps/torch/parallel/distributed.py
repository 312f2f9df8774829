"""byteps' own DistributedDataParallel: torch's DDP interface, gradients averaged through byteps.

No torch.distributed process group is needed. At construction the module's
parameters (and buffers, with ``broadcast_buffers``) are broadcast from
rank 0. During backward, each parameter's gradient is push_pulled as soon as
it has been accumulated, overlapping the rest of the backward pass; a
callback queued on the autograd engine waits for all of them at the end of
backward, so after ``loss.backward()`` every ``p.grad`` holds the average
over all workers and any optimizer can step.

Example (run under ``bpslaunch -np 2 -- python train.py``)::

    import byteps.torch as bps
    from byteps.torch.parallel import DistributedDataParallel

    bps.init()
    model = DistributedDataParallel(Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(loader):
        if i % 2 == 0:
            with model.no_sync():           # accumulate locally, no communication
                loss_fn(model(x), y).backward()
            continue
        loss_fn(model(x), y).backward()     # gradients of both passes averaged here
        optimizer.step()
        optimizer.zero_grad()
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import torch

from byteps.common.frontend import Average, size
from byteps.torch.buckets import Bucket, GradientBuckets, push_pull_bucket, wait_gradient
from byteps.torch.collectives import _sparse_allreduce_async
from byteps.torch.compression import Compression
from byteps.torch.functions import broadcast_parameters
from byteps.torch.ops import push_pull_async_inplace, synchronize
from byteps.torch.row_sparse import no_rows, sparse_parameters

__all__ = ["DistributedDataParallel"]

# Every rank builds its DistributedDataParallel modules in the same order, so
# this counter gives each module the same name prefix on every rank.
_instances = itertools.count()
_SPARSE = object()  # the "compressor context" of a sparse gradient's handle


class DistributedDataParallel(torch.nn.Module):
    """Wrap ``module`` for data-parallel training over byteps.

    ``device_ids`` is accepted for torch compatibility: None (CPU, or the
    module's current device) or the single device the module already lives
    on; the module is never moved. With ``broadcast_buffers`` the buffers
    (e.g. BatchNorm statistics) are broadcast from rank 0 at construction
    and at every forward in training mode, as torch's DDP does.
    ``compression`` is a Horovod compressor (``Compression.fp16`` sends
    float16). Parameters that get no gradient in a backward pass (unused
    branches) are averaged as zeros, so ``find_unused_parameters`` is
    accepted and has nothing left to do. The sparse gradients of
    ``nn.Embedding``/``nn.EmbeddingBag(sparse=True)`` layers go alone,
    through :func:`~byteps.torch.collectives.sparse_allreduce_async` (the
    row-sparse push_pull where the job allows it, docs/sparse.md), and come
    back as sparse gradients, averaged; a rank whose embedding got no
    gradient sends no rows.
    """

    def __init__(self, module: torch.nn.Module, device_ids: Optional[Sequence[Any]] = None,
                 broadcast_buffers: bool = True, compression: Any = Compression.none,
                 find_unused_parameters: bool = False) -> None:
        super().__init__()
        if device_ids is not None and len(device_ids) > 1:
            raise ValueError("DistributedDataParallel takes one device per process; got device_ids="
                             f"{list(device_ids)!r}")
        self.module = module
        self.device_ids = list(device_ids) if device_ids is not None else None
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True
        self._compression = compression
        self._prefix = f"DistributedDataParallel.{next(_instances)}."
        self._names: Dict[torch.Tensor, str] = {p: name for name, p in module.named_parameters()}
        self._sparse = sparse_parameters(module) & set(self._names)  # gradients sent row-sparse, never fused
        self._pending: Dict[torch.Tensor, Tuple[int, Any]] = {}   # parameter -> (handle, compressor context)
        self._callback_queued = False
        self._communicate = size() > 1
        # Small gradients travel fused, in buckets decided from the parameters (see byteps.torch.buckets).
        gradient_names = {p: self._prefix + "Gradient." + name for p, name in self._names.items()}
        # sparse gradients are tables of their own (not declared as dense tensors, never fused)
        self._buckets = GradientBuckets({p: n for p, n in gradient_names.items() if p not in self._sparse},
                                        compression)
        self._tables = {p: n for p, n in gradient_names.items() if p in self._sparse}
        self._plan: Optional[Dict[torch.Tensor, Bucket]] = None   # this backward's buckets, once known
        self._hooked: Set[torch.Tensor] = set()
        self._buckets.declare(self._current_plan() if self._communicate else {})
        self._plan = None
        tensors = [(self._prefix + name, p.data) for p, name in self._names.items()]
        broadcast_parameters(tensors + self._named_buffers() if broadcast_buffers else tensors, root_rank=0)
        if self._communicate:
            self._register_hooks()

    def _current_plan(self) -> Dict[torch.Tensor, Bucket]:
        """This backward's buckets, over the parameters requiring grad when its first gradient came."""
        if self._plan is None:
            self._plan = self._buckets.plan([p for p in self._names if p.requires_grad and p not in self._sparse])
        return self._plan

    def _register_hooks(self) -> None:
        """Hook each parameter that requires grad (again after each backward: requires_grad may change)."""
        for p in self._names:
            if p.requires_grad and p not in self._hooked:
                p.register_post_accumulate_grad_hook(self._gradient_ready)
                self._hooked.add(p)

    def _named_buffers(self) -> List[Tuple[str, torch.Tensor]]:
        return [(self._prefix + "buffer." + name, b) for name, b in self.module.named_buffers()]

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if self.broadcast_buffers and self.training and self._communicate:
            buffers = self._named_buffers()
            if buffers:
                broadcast_parameters(buffers, root_rank=0)
        return self.module(*inputs, **kwargs)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally; the first backward after the block averages them all."""
        previous, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    def _gradient_ready(self, p: torch.Tensor) -> None:
        if not self.require_backward_grad_sync:
            return
        if not self._callback_queued:
            # Runs once the whole backward pass is done, on the engine's thread.
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
            self._callback_queued = True
        bucket = self._current_plan().get(p)
        if bucket is None:
            self._start_push_pull(p)
        elif bucket.add_ready(p):
            self._start_bucket(bucket)

    def _prepare(self, p: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        """``p``'s gradient as it is sent: (contiguous buffer, compressor context)."""
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        compressed, ctx = self._compression.compress(p.grad)
        # Non-contiguous gradients (channels_last) go through a contiguous copy.
        return (compressed if compressed.is_contiguous() else compressed.contiguous()), ctx

    def _start_push_pull(self, p: torch.Tensor) -> None:
        if p in self._sparse:
            gradient = p.grad if p.grad is not None and p.grad.is_sparse else no_rows(p, 1)
            name = self._tables[p]
            self._pending[p] = (_sparse_allreduce_async(gradient, name, Average, None, name), _SPARSE)
            return
        buffer, ctx = self._prepare(p)
        self._pending[p] = (push_pull_async_inplace(buffer, average=True, name=self._buckets.names[p]), ctx)

    def _start_bucket(self, bucket: Bucket) -> None:
        prepared = [self._prepare(p) for p in bucket.members]
        handles = push_pull_bucket(bucket, [buffer for buffer, _ in prepared], True,
                                   [self._buckets.names[p] for p in bucket.members])
        bucket.started = True
        for p, (_, ctx), handle in zip(bucket.members, prepared, handles):
            self._pending[p] = (handle, ctx)

    def _finish_backward(self) -> None:
        self._callback_queued = False
        # A parameter unused here may have been used on another rank: the missing ones go as zeros.
        plan = self._current_plan()
        unsent = [p for p in self._names if p.requires_grad and p not in self._pending]
        self._buckets.start_unsent(plan, unsent, self._start_push_pull, self._start_bucket)
        pending, self._pending = self._pending, {}
        try:
            for p, (handle, ctx) in pending.items():
                if ctx is _SPARSE:
                    p.grad = synchronize(handle)  # sparse, averaged
                    continue
                output = self._compression.decompress(wait_gradient(handle), ctx)
                if output.data_ptr() != p.grad.data_ptr():
                    p.grad.copy_(output)
        finally:
            self._buckets.reset(plan)
            self._plan = None
        self._register_hooks()
