"""DistributedOptimizer: Horovod's gradient-averaging optimizer wrapper over byteps.

Each parameter gets a post-accumulate-grad hook. Once its gradient has been
accumulated ``backward_passes_per_step`` times, the hook starts an
asynchronous push_pull of it, so communication of late layers overlaps the
backward pass of early ones. ``step()`` (or an explicit ``synchronize()``)
waits for all of them and leaves the averaged gradients in ``p.grad``.

Small gradients (biases, norms: at most BYTEPS_FUSION_MAX_TENSOR_BYTES) are
fused, as torch DDP buckets them: byteps-common's planner packs them, in
parameter order, into buckets of at most BYTEPS_FUSION_THRESHOLD bytes, and
a bucket is push_pulled as one buffer once its last gradient is ready, so
hundreds of tiny gradients cost a few messages. The buckets depend only on
the parameters (order, sizes, dtypes, which require grad), never on timing,
so every rank builds the same ones. BYTEPS_FUSION_THRESHOLD=0 sends every
gradient alone.

Example (run under ``bpslaunch -np 2 -- python train.py``)::

    import byteps.torch as bps

    bps.init()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * bps.size())
    optimizer = bps.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bps.broadcast_optimizer_state(optimizer, root_rank=0)
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()

Gradient clipping (or AMP unscaling) needs the averaged gradients before
the step::

    loss.backward()
    optimizer.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    with optimizer.skip_synchronize():
        optimizer.step()
"""

from __future__ import annotations

import itertools
import warnings
import weakref
from collections import Counter
from contextlib import contextmanager
from typing import Any, Dict, Iterable, Iterator, List, NamedTuple, Optional, Set, Tuple

import torch

from byteps.common import api
from byteps.common.compression import NesterovMomentum, parse_compression_params, warn_if_feedback_meets_momentum
from byteps.common.frontend import Adasum, Average, check_gradient_op, check_passes
from byteps.common.frontend.async_training import async_enabled, check_async_compression
from byteps.common.frontend.process import on_init
from byteps.common.frontend.process_sets import global_process_set, rank_view
from byteps.torch.adasum_optimizer import AdasumDistributedOptimizer, check_adasum_options
from byteps.torch.async_optimizer import AsyncDistributedOptimizer
from byteps.torch.buckets import Bucket, GradientBuckets, push_pull_bucket, wait_gradient
from byteps.torch.collectives import _sparse_allreduce_async
from byteps.torch.compression import Compression
from byteps.torch.gradient_hooks import hook_gradient
from byteps.torch.horovod_ops import allreduce_async_
from byteps.torch.ops import push_pull_async_inplace
from byteps.torch.row_sparse import no_rows, takes_row_sparse

__all__ = ["DistributedOptimizer"]

#: Prefix of every gradient's push_pull name, as in BytePS (keeps them apart from broadcasts).
GRADIENT_PREFIX = "Gradient."


_optimizers: weakref.WeakSet[Any] = weakref.WeakSet()   # every synchronous DistributedOptimizer alive
_creation_order = itertools.count()


def _rejoin_all() -> None:
    for optimizer in sorted(_optimizers, key=lambda o: o._created):
        optimizer._rejoin_if_moved()


on_init(_rejoin_all)


class _PendingGradient(NamedTuple):
    """One parameter's gradient on its way through a push_pull."""

    handle: int
    ctx: Any            # the compressor's context
    postscale: float
    momentum: bool = False  # BytePS's Nesterov momentum is still to apply (the gradient went uncompressed)


class _DistributedOptimizer:
    """Mixed in front of the wrapped optimizer's class; see :func:`DistributedOptimizer`."""

    def _setup_distributed(self, named_parameters: List[Tuple[str, torch.Tensor]], compression: Any,
                           backward_passes_per_step: int, op: Any, gradient_predivide_factor: float,
                           sparse_as_dense: bool = False, process_set: Any = global_process_set,
                           compression_params: Any = None) -> None:
        self._compression_spec, self._nesterov = self._take_compression_params(compression_params)
        if self._compression_spec is not None and self._compression_spec.fp16 and compression is Compression.none:
            compression = Compression.fp16
        if self._compression_spec is not None and self._compression_spec.compressor == "none":
            self._compression_spec = None  # fp16 alone
        self._compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._sparse: Set[torch.Tensor] = set()   # gradients that were sparse this step (returned sparse)
        self._sparse_dims: Dict[torch.Tensor, int] = {}  # sent sparse before: their sparse dimensions
        self._alone: Set[torch.Tensor] = set()  # sparse gradients kept out of fusion to go row-sparse
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        names = {id(p): name for name, p in named_parameters}
        self._parameter_names: Dict[torch.Tensor, str] = {}
        for group in self.param_groups:
            for p in group["params"]:
                self._parameter_names[p] = names[id(p)]
        self._hooked: Set[torch.Tensor] = set()
        self._should_synchronize = True
        self._worker: Any = None
        self._created = next(_creation_order)  # optimizers declare again in the order they were made
        self._join_job()
        _optimizers.add(self)

    def _join_job(self) -> None:
        """Start from a clean step in the worker's job: at construction, and after a change of membership.

        Elastic training puts the worker into a new job (other ranks, maybe
        another size); what this optimizer had in flight belonged to the old
        one, and its gradients' names must be declared again, in the order
        every rank declares them.
        """
        self._worker = api.worker() if api.is_initialized() else None
        # A rank outside the set steps on its own gradients, as in Horovod.
        included = self.process_set is None or self.process_set.included()
        self._view = rank_view(self.process_set) if included else None
        self._passes_left: Dict[torch.Tensor, int] = {p: self.backward_passes_per_step for p in self._parameter_names}
        self._touched: Set[torch.Tensor] = set()      # gradient accumulated since the last synchronize
        self._pending: Dict[torch.Tensor, _PendingGradient] = {}
        self._sparse.clear()
        self._alone.clear()  # the new job may not allow the row-sparse path: every rank plans afresh
        self._synchronized = False
        self._communicate = included and self._view.size > 1   # one worker: nothing to average (as Horovod)
        # Compressed gradients are fused apart, each compressed alone inside its bucket (as BytePS
        # compresses each tensor's partitions); the small ones that go uncompressed as usual.
        self._buckets = GradientBuckets({p: GRADIENT_PREFIX + name for p, name in self._parameter_names.items()},
                                        self._compression, compressed=self._goes_compressed,
                                        lr_group=self._lr_group)
        self._plan: Optional[Dict[torch.Tensor, Bucket]] = None   # this step's buckets, once known
        self._rounds_behind = 0  # backup workers: rounds closed without this worker, as of the last step
        if self._communicate:
            self._register_hooks()
        self._buckets.declare(self._current_plan() if self._communicate else {})
        self._plan = None

    def _rejoin_if_moved(self) -> None:
        """After init(): join again if the process is in another job now (elastic training's next epoch)."""
        if api.is_initialized() and api.worker() is not self._worker:
            self._join_job()

    def _take_compression_params(self, params: Any) -> Tuple[Any, Optional[NesterovMomentum]]:
        """BytePS's compression_params, parsed; with momentum="nesterov" the optimizer's own momentum is
        turned off and byteps applies it (before compression, or after the pull for small tensors)."""
        if not params:
            return None, None
        momenta = {group.get("momentum") for group in self.param_groups}
        wants_momentum = str(params.get("momentum", "") or "").lower() == "nesterov"
        if wants_momentum and len(momenta) != 1:
            raise ValueError("compression_params['momentum'] = 'nesterov' needs one momentum for every param "
                             f"group; the optimizer has {sorted(map(str, momenta))}")
        spec = parse_compression_params(params, momenta.pop() if wants_momentum else None)
        if spec is None or spec.momentum is None:
            warn_if_feedback_meets_momentum(spec, max((float(m or 0.0) for m in momenta), default=0.0))
            return spec, None
        for group in self.param_groups:
            group["momentum"] = 0.0
            if "nesterov" in group:
                group["nesterov"] = False
        return spec, NesterovMomentum(spec.momentum)

    @property
    def _plans(self) -> Dict[Tuple[int, ...], Dict[torch.Tensor, Bucket]]:
        """The bucket plans made so far (see :class:`byteps.torch.buckets.GradientBuckets`)."""
        return self._buckets.plans

    def _register_hooks(self) -> None:
        """Hook every parameter that requires grad and has no hook yet.

        Called again at each synchronize, so a parameter whose requires_grad
        was switched on later is hooked from its next backward on.
        """
        for p in self._parameter_names:
            if p.requires_grad and p not in self._hooked:
                hook_gradient(p, self._gradient_ready)  # a wrapper made before loses p's hook
                self._hooked.add(p)

    def _gradient_ready(self, p: torch.Tensor) -> None:
        if p in self._pending or self._passes_left[p] == 0:
            raise RuntimeError(
                f"the gradient of {self._parameter_names[p]!r} was computed more than backward_passes_per_step="
                f"{self.backward_passes_per_step} times before step(); raise backward_passes_per_step to "
                "accumulate gradients locally")
        self._touched.add(p)
        self._synchronized = False
        self._passes_left[p] -= 1
        if self._passes_left[p] == 0:
            bucket = self._current_plan().get(p)
            if bucket is None:
                self._start_push_pull(p)
            elif bucket.add_ready(p):
                self._start_bucket(bucket)

    def _current_plan(self) -> Dict[torch.Tensor, Bucket]:
        """This step's buckets: over the parameters hooked and requiring grad when the step's first gradient came.

        Ranks freeze and unfreeze parameters alike, so every rank plans the
        same buckets; a rank that does not gets a mismatch error from the
        servers (bucket names encode their members), not a wrong sum.
        """
        if self._plan is None:
            if self._view.set_id:
                self._plan = {}  # a process set's gradients go one by one (fusion spans every rank)
            else:
                self._plan = self._buckets.plan([p for p in self._parameter_names
                                                 if p in self._hooked and p.requires_grad and p not in self._alone])
        return self._plan

    def _goes_compressed(self, nbytes: int) -> bool:
        """Whether a gradient sent as ``nbytes`` is compressed (compression_params, large enough, servers)."""
        return self._compression_spec is not None and api.worker().compresses(nbytes, True, self._compression_spec)

    def _prepare(self, p: torch.Tensor) -> Tuple[torch.Tensor, Any, bool, float]:
        """``p``'s gradient as it is sent: (contiguous buffer, compressor context, average, postscale)."""
        if p.grad is None:
            # Not computed here, but maybe on another rank (unused branch,
            # requires_grad switched): every rank must submit the same names.
            p.grad = torch.zeros_like(p)
        elif p.grad.is_sparse:
            # Reduced densely (the same sum), handed back sparse at synchronize. A small table fused this
            # step goes alone from the next plan on when it can go row-sparse (every rank sees its gradient
            # sparse alike, so every rank plans alike).
            self._sparse.add(p)
            if not self.sparse_as_dense and takes_row_sparse(p.grad, self.op, self.process_set):
                self._sparse_dims[p] = p.grad.sparse_dim()
                self._alone.add(p)
            p.grad = p.grad.to_dense()
        grad, average, postscale = p.grad, self.op == Average, 1.0
        if average and self.gradient_predivide_factor != 1.0:
            # Horovod: divide by f before the sum, multiply by f / size after.
            grad = grad / self.gradient_predivide_factor
            average, postscale = False, self.gradient_predivide_factor / self._view.size
        compressed, ctx = self._compression.compress(grad)
        # Non-contiguous gradients (channels_last) go through a contiguous copy.
        buffer = compressed if compressed.is_contiguous() else compressed.contiguous()
        return buffer, ctx, average, postscale

    def _start_push_pull(self, p: torch.Tensor) -> None:
        name = GRADIENT_PREFIX + self._parameter_names[p]
        if p.grad is None and p in self._sparse_dims and not self.sparse_as_dense:
            # No gradient here this step, but the other ranks' are sparse: push no rows rather than dense
            # zeros, which would meet nothing of the name on the other ranks.
            p.grad = no_rows(p, self._sparse_dims[p])
        if p.grad is not None and p.grad.is_sparse and not self.sparse_as_dense:
            self._sparse_dims[p] = p.grad.sparse_dim()
            # Row-sparse through the servers where the job allows it, else Horovod's gather; the sum stays
            # sparse. The table is the gradient's name, as a dense gradient's tensor is.
            handle = _sparse_allreduce_async(p.grad, name, self.op, self.process_set, name)
            self._pending[p] = _PendingGradient(handle, None, 1.0)
            return
        buffer, ctx, average, postscale = self._prepare(p)
        if self._view.set_id:
            handle = allreduce_async_(buffer, average=average, name=name, process_set=self.process_set)
        else:
            handle = push_pull_async_inplace(buffer, average=average, name=name,
                                             compression_spec=self._compression_spec, lr=self._lr_of(p))
        momentum = self._nesterov is not None and not self._goes_compressed(buffer.numel() * buffer.element_size())
        self._pending[p] = _PendingGradient(handle, ctx, postscale, momentum)

    def _lr_of(self, p: torch.Tensor) -> Optional[float]:
        """The learning rate of ``p``'s param group now (error feedback rescales by its change)."""
        if self._compression_spec is None:
            return None
        return float(self.param_groups[self._lr_group(p)]["lr"])

    def _lr_group(self, p: torch.Tensor) -> int:
        """The index of ``p``'s param group."""
        return next(index for index, group in enumerate(self.param_groups) if any(q is p for q in group["params"]))

    def _start_bucket(self, bucket: Bucket) -> None:
        prepared = [self._prepare(p) for p in bucket.members]
        compressed = bucket.group.compressed
        handles = push_pull_bucket(bucket, [item[0] for item in prepared], prepared[0][2],
                                   [GRADIENT_PREFIX + self._parameter_names[p] for p in bucket.members],
                                   self._compression_spec if compressed else None,
                                   self._lr_of(bucket.members[0]) if compressed else None)
        bucket.started = True
        momentum = self._nesterov is not None and not compressed  # uncompressed: the momentum comes after
        for p, (_, ctx, _, postscale), handle in zip(bucket.members, prepared, handles):
            self._pending[p] = _PendingGradient(handle, ctx, postscale, momentum)

    def synchronize(self) -> None:
        """Wait for every gradient's push_pull and write the averages into ``p.grad``.

        Parameters that require grad but got no gradient since the last
        synchronize are reduced as zeros, since another rank may have one.
        """
        if not self._communicate:
            if self._nesterov is not None:  # one worker: nothing is sent, the momentum is still ours to apply
                with torch.no_grad():
                    for p, name in self._parameter_names.items():
                        if p.grad is not None:
                            self._nesterov.apply(name, p.grad, torch.zeros_like)
            self._synchronized = True
            return
        if self._synchronized and not self._pending:
            return
        plan = self._current_plan()
        unsent = [p for p in self._parameter_names
                  if p not in self._pending and (p.requires_grad or p in self._touched or p in plan)]
        self._buckets.start_unsent(plan, unsent, self._start_push_pull, self._start_bucket)
        pending, self._pending = self._pending, {}
        waited: set = set()
        try:
            for p, item in pending.items():
                waited.add(p)
                result = wait_gradient(item.handle)
                if result.is_sparse:
                    p.grad = result
                    continue
                output = self._compression.decompress(result, item.ctx)
                if item.postscale != 1.0:
                    output = output * item.postscale
                if output.data_ptr() != p.grad.data_ptr():
                    p.grad.copy_(output)
                if item.momentum:
                    with torch.no_grad():
                        self._nesterov.apply(self._parameter_names[p], p.grad, torch.zeros_like)
                if p in self._sparse:
                    p.grad = p.grad.to_sparse()
        finally:
            _spend_handles([item.handle for p, item in pending.items() if p not in waited])
            self._sparse.clear()
            for p in self._parameter_names:
                self._passes_left[p] = self.backward_passes_per_step
            self._touched.clear()
            self._buckets.reset(plan)
            self._plan = None
        self._register_hooks()
        self._synchronized = True
        self._rounds_behind = api.worker().take_rounds_behind()

    def skip_step(self) -> bool:
        """Backup workers (BYTEPS_BACKUP_WORKERS): step without computing when this worker is behind.

        When the answers of the last step said that the next round has
        already closed without this worker (the others went on without
        it), this takes that round's averaged gradients from the servers,
        steps with them, and returns True: skip this batch's forward and
        backward, as the others applied that round without it. Otherwise
        (in time, no backup workers, one worker, compression, a process
        set) it returns False: compute as usual. With several processes per
        machine the machine is what is late: every local rank learns the same
        rounds behind and skips the same steps. A slow worker then computes only the rounds it can still
        join, and the job goes at the pace of the others::

            for x, y in loader:
                if optimizer.skip_step():
                    continue
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                optimizer.step()
        """
        worker = api.worker()
        if (self._rounds_behind < 1 or not self._communicate or self._view.set_id
                or self._compression_spec is not None or self._pending):
            return False
        with torch.no_grad():
            for p in self._parameter_names:
                if p.grad is not None:
                    p.grad = None  # sent as zeros, and replaced by the round's averages
        with worker.skipping_round():
            self.synchronize()
        with self.skip_synchronize():
            self.step()
        return True

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Let ``step()`` use the gradients as they are (after an explicit ``synchronize()``)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        if self._should_synchronize:
            if self._synchronized and self._communicate:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() after optimizer.synchronize(); "
                    "use the skip_synchronize() context to make that explicit", stacklevel=2)
            self.synchronize()
        self._synchronized = False
        return super().step(closure)

    # step() must not be wrapped again by torch's profiling/hook wrapper:
    # the wrapped class's own step (called through super()) already runs the hooks.
    step.hooked = True  # type: ignore[attr-defined]

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._pending or any(left != self.backward_passes_per_step for left in self._passes_left.values()):
            raise ValueError(
                "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                "optimizer.synchronize(); push_pulls of the gradients are pending, and zeroing them now would race")
        return super().zero_grad(set_to_none)


def _spend_handles(handles: List[Any]) -> None:
    """After one gradient's push_pull failed: wait for the others too (their errors are the same failure), so
    that their names are free for the next step."""
    for handle in handles:
        try:
            wait_gradient(handle)
        except Exception:  # noqa: BLE001 - the first failure is the one raised
            pass


def _named_parameters(optimizer: torch.optim.Optimizer,
                      named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]]) -> List[Tuple[str, torch.Tensor]]:
    if named_parameters is None:
        return [(f"noname.{i}.{j}", p)
                for i, group in enumerate(optimizer.param_groups) for j, p in enumerate(group["params"])]
    named = list(named_parameters)
    if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
        raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, "
                         "usually produced by model.named_parameters()")
    duplicates = sorted(name for name, count in Counter(name for name, _ in named).items() if count > 1)
    if duplicates:
        raise ValueError(f"parameter names in named_parameters must be unique; duplicates: {', '.join(duplicates)}")
    named_ids = {id(p) for _, p in named}
    unnamed = [f"group {i} parameter {j} (shape {tuple(p.shape)})"
               for i, group in enumerate(optimizer.param_groups) for j, p in enumerate(group["params"])
               if id(p) not in named_ids]
    if unnamed:
        raise ValueError("named_parameters was given, but some of the optimizer's parameters are not in it: "
                         + "; ".join(unnamed))
    return named


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]] = None,
                         compression: Any = Compression.none, backward_passes_per_step: int = 1,
                         op: Any = Average, gradient_predivide_factor: float = 1.0, groups: Any = None,
                         sparse_as_dense: bool = False,
                         process_set: Any = global_process_set,
                         compression_params: Optional[Dict[str, Any]] = None) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that ``step()`` uses gradients averaged over all workers.

    Returns an instance of a subclass of ``optimizer``'s class (so
    ``isinstance`` checks and learning-rate schedulers keep working) that
    shares its param groups, state and hooks; use it instead of the original
    from then on.

    ``named_parameters`` (usually ``model.named_parameters()``) names the
    push_pulls; without it the names come from the parameters' positions in
    the param groups, which is fine as long as every rank builds the same
    optimizer. ``backward_passes_per_step`` accumulates that many backward
    passes locally before communicating. ``compression=Compression.fp16``
    sends float16. ``op`` is ``Average`` or ``Sum``, or ``Adasum``: Horovod's
    delta optimizer, where each rank steps on its own gradients and the
    parameters' changes are combined by Adasum
    (:mod:`byteps.torch.adasum_optimizer`, which lists what it refuses). With
    ``gradient_predivide_factor=f`` each gradient is divided by ``f`` before
    the sum and multiplied by ``f / size()`` after (Horovod), which can keep
    float16 sums in range.

    Every rank must push_pull the same gradients each step. A parameter
    that requires grad but got no gradient (a branch unused on this rank)
    is averaged as zeros; a parameter with ``requires_grad=False`` is left
    out, so freeze and unfreeze parameters alike on every rank (a parameter
    unfrozen later is hooked from its next step on). Small gradients are
    fused into shared buffers (see the module docstring and
    BYTEPS_FUSION_THRESHOLD). With one worker
    nothing is communicated, as in Horovod. Wrapping the same parameters
    again moves their hooks to the new optimizer.

    Sparse gradients (``nn.Embedding(sparse=True)``, ``nn.EmbeddingBag(sparse=True)``)
    go through :func:`~byteps.torch.collectives.sparse_allreduce_async`: a
    row-sparse push_pull through the servers where the job allows it
    (servers, op Average or Sum, no process set; float16/32/64, bfloat16),
    which pushes the rows a rank touched and hands back a coalesced sparse
    gradient over the union of every rank's rows;
    otherwise Horovod's gather of indices and values. Either
    result steps SGD, SparseAdam or Adagrad alike. With
    ``sparse_as_dense=True`` they are reduced densely, then handed back
    sparse, as is a small table fused with other small gradients: where it
    can go row-sparse, only in its first step (it leaves its bucket from
    the next step on). A rank whose sparse parameter got no gradient in a
    step pushes no rows once its gradient was sparse before (dense zeros in
    its first step). docs/sparse.md has which path each case takes.
    ``process_set`` averages over that set's ranks only (its gradients are
    not fused). ``groups`` (Horovod's explicit fusion groups: a number, or
    lists of parameters) is checked and otherwise left to byteps' own
    fusion, which groups small gradients by itself (docs/horovod-compatibility.md).

    ``compression_params`` is BytePS's gradient compression, the dict its
    MXNet DistributedTrainer takes (docs/compression.md), e.g.
    ``{"compressor": "onebit", "scaling": True, "ef": "vanilla",
    "momentum": "nesterov"}``: gradients of at least
    BYTEPS_MIN_COMPRESS_BYTES are compressed on their way to the servers
    (one by one, not fused) and summed there; ``"momentum": "nesterov"``
    takes the optimizer's momentum factor and turns the optimizer's own
    momentum off, as BytePS does.

    With BYTEPS_ENABLE_ASYNC=1 (on every process) the same call returns
    BytePS's asynchronous optimizer instead: each ``step()`` applies this
    worker's own gradients locally, pushes the parameters' change and takes
    the servers' parameters (:mod:`byteps.torch.async_optimizer`, docs/async.md).
    """
    check_gradient_op(op, gradient_predivide_factor)
    check_passes(backward_passes_per_step)
    if isinstance(optimizer, (_DistributedOptimizer, AsyncDistributedOptimizer, AdasumDistributedOptimizer)):
        raise ValueError("this optimizer is already a DistributedOptimizer; wrap the original optimizer once")
    named = _named_parameters(optimizer, named_parameters)
    base = optimizer.__class__
    _check_groups(groups, optimizer)
    if op == Adasum:
        check_adasum_options(optimizer, compression, sparse_as_dense, process_set, compression_params)
        wrapped = _share(optimizer, type(base.__name__, (AdasumDistributedOptimizer, base), {}))
        wrapped._setup_adasum(named, compression, backward_passes_per_step)
        return wrapped
    if api.is_initialized() and async_enabled():
        check_async_compression(compression_params, compression is Compression.none)
        if process_set is not global_process_set and process_set is not None:
            raise ValueError("BYTEPS_ENABLE_ASYNC=1 exchanges parameters over every worker: drop process_set")
        wrapped = _share(optimizer, type(base.__name__, (AsyncDistributedOptimizer, base), {}))
        wrapped._setup_async(named)
        return wrapped
    wrapped = _share(optimizer, type(base.__name__, (_DistributedOptimizer, base), {}))
    wrapped._setup_distributed(named, compression, backward_passes_per_step, op, gradient_predivide_factor,
                               sparse_as_dense, process_set, compression_params)
    return wrapped


def _share(optimizer: torch.optim.Optimizer, cls: type) -> torch.optim.Optimizer:
    """An instance of ``cls`` sharing everything with ``optimizer`` (param groups, state, defaults, hook
    tables) rather than a second optimizer: a state loaded before wrapping survives."""
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    return wrapped


def _check_groups(groups: Any, optimizer: torch.optim.Optimizer) -> None:
    """Horovod's ``groups``: None, a positive number of groups, or lists of the optimizer's parameters."""
    if groups is None:
        return
    if isinstance(groups, int) and not isinstance(groups, bool):
        if groups < 1:
            raise ValueError(f"groups must be a positive number of groups, got {groups}")
        return
    known = {id(p) for group in optimizer.param_groups for p in group["params"]}
    try:
        listed = [p for group in groups for p in group]
    except TypeError:
        raise ValueError("groups must be a number or a list of lists of parameters") from None
    if any(not isinstance(p, torch.Tensor) or id(p) not in known for p in listed):
        raise ValueError("groups must list parameters of the optimizer")
