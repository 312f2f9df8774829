"""DistributedTrainer: a gluon Trainer whose steps use gradients averaged over all ranks.

BytePS's ``DistributedTrainer`` with Horovod's keywords. It broadcasts the
root's parameters when it is built (a parameter awaiting deferred
initialisation right after that, in the first forward pass), so the first
gradients already come from the root's weights, and again in the first
``step()`` (or ``allreduce_grads()``), as BytePS and Horovod do, which also
covers weights changed in between (e.g. a checkpoint loaded on the root).
Every step push_pulls each gradient in place before the update:
gradient *i* (parameters in the order of their names) under
``"<prefix>Gradient.<name>"`` with engine priority ``-i``, as in BytePS.
Parameters come in the order of their names whatever order they are passed
in, so ranks agree on names and ids. Everything is queued on MXNet's
engine; ``step()`` returns without waiting for the network.

Example (``bpslaunch -np 2 -- python train.py``)::

    trainer = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    with mx.autograd.record():
        loss = loss_fn(net(x), y)
    loss.backward()
    trainer.step(batch_size)           # this worker's batch size, as with one process

Gradients are *averaged* over the ranks in the push_pull, so after
``allreduce_grads()`` (e.g. for clipping) they have the scale of one
worker's, and ``step(batch_size)`` takes the per-worker batch size.
Horovod and BytePS sum and divide the learning-rate scale by the number of
ranks instead; the update is the same. ``compression_params`` compresses
them (one by one, through the servers; see :class:`DistributedTrainer` and
:mod:`byteps.mxnet.gradient_compression`).

With BYTEPS_ENABLE_ASYNC=1 (on every process) the same trainer trains
asynchronously, as BytePS's does: ``allreduce_grads()`` leaves each
gradient this worker's own, ``update()`` (and so ``step()``) makes exactly
the update a plain gluon Trainer would, then exchanges every trainable
parameter with the servers (:mod:`byteps.mxnet.async_training`).
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Tuple

import mxnet as mx
import numpy as np
from mxnet.gluon.parameter import Parameter, ParameterDict

from byteps.common import api
from byteps.common.compression import CompressionSpec
from byteps.common.frontend.async_training import check_async_compression
from byteps.common.frontend.process import size
from byteps.common.frontend.process_sets import rank_view
from byteps.common.frontend.reductions import Average
from byteps.mxnet.async_training import ArrayExchange, asynchronous, check_master_weights
from byteps.mxnet.backup_workers import rounds_behind, skip_round
from byteps.mxnet.compression import Compression
from byteps.mxnet.functions import broadcast_after_init, parameter_name
from byteps.mxnet.gradient_compression import take_compression_params
from byteps.mxnet.ops import allreduce_, allreduce_group_, broadcast_, byteps_declare_tensor
from byteps.mxnet.optimizer import DistributedOptimizer
from byteps.mxnet.row_sparse import start as start_row_sparse
from byteps.mxnet.row_sparse import takes_row_sparse

__all__ = ["DistributedTrainer"]


def _cast_of(compression: Any, spec: Optional[CompressionSpec]) -> Any:
    """The cast compressor from Horovod's ``compression`` or ``compression_params={'fp16': True}``."""
    from_params = Compression.fp16 if spec is not None and spec.fp16 else None
    if compression is None or compression is Compression.none:
        return from_params or Compression.none
    if from_params is not None and from_params is not compression:
        raise ValueError("pass either compression or compression_params={'fp16': True}, not both")
    return compression


def _sorted_parameters(params: Any) -> List[Parameter]:
    if isinstance(params, (dict, ParameterDict)):
        return [params[key] for key in sorted(params.keys())]
    if isinstance(params, (list, tuple)):
        return sorted(params, key=lambda p: p.name if isinstance(p, Parameter) else "")
    raise ValueError(f"DistributedTrainer: params must be a ParameterDict, dict or list of Parameters, "
                     f"got {type(params).__name__}")


class DistributedTrainer(mx.gluon.Trainer):
    """A gluon ``Trainer`` (without kvstore) that averages gradients over all ranks through byteps.

    ``optimizer`` and ``optimizer_params`` as for ``gluon.Trainer``;
    ``root_rank`` is the rank whose parameters everybody starts from.
    Horovod's ``gradient_predivide_factor`` and ``prefix`` (name prefix, for
    several trainers in one job) are accepted; ``num_groups`` is accepted
    and ignored.

    ``process_set`` (Horovod's): gradients are averaged over its ranks only,
    each gradient its own op (fusion packs collectives over every rank), and
    the parameters start from ``root_rank``'s within the set. A rank outside
    the set, or a set of one rank, keeps its own gradients and parameters.
    Not with ``compression_params`` or asynchronous training.

    ``compression_params`` is BytePS's gradient compression
    (docs/compression.md), e.g. ``{"compressor": "onebit", "scaling": True,
    "ef": "vanilla", "momentum": "nesterov"}``, or ``{"fp16": True}`` (the
    same as Horovod's ``compression=Compression.fp16``). With a compressor,
    gradients of at least BYTEPS_MIN_COMPRESS_BYTES go alone, with the
    trainer's current ``learning_rate``, and are averaged, then compressed,
    on their way through the servers; smaller ones are fused as usual.
    ``"momentum": "nesterov"`` takes its factor from
    ``optimizer_params["momentum"]`` (or the optimizer object's
    ``momentum``) and runs the optimizer with momentum 0.0; with
    ``onebit`` the optimizer's ``wd`` moves out of it too and comes back
    with its own momentum before each update, as in BytePS.

    >>> trainer = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9},
    ...     compression_params={"compressor": "topk", "k": 0.01, "ef": "vanilla", "momentum": "nesterov"})

    Asynchronous training (BYTEPS_ENABLE_ASYNC=1): no gradient is averaged
    (``gradient_predivide_factor`` has nothing to act on) and nothing
    divides by the number of workers: each ``step(batch_size)`` is this
    worker's plain gluon update, after which every parameter with a
    gradient pushes its change under ``"AsyncParameter.<prefix><name>"``
    and takes the servers' value (the first step first broadcasts rank 0's
    values into the servers). Parameters without one (``grad_req="null"``,
    e.g. BatchNorm's running statistics) stay this worker's own. Compression
    (``compression_params``, ``compression=``) is refused: deltas travel
    uncompressed.
    """

    def __init__(self, params: Any, optimizer: Any, optimizer_params: Optional[Dict[str, Any]] = None,
                 root_rank: int = 0, compression_params: Optional[Dict[str, Any]] = None, *,
                 compression: Any = None, gradient_predivide_factor: float = 1.0, prefix: Optional[str] = None,
                 num_groups: int = 0, process_set: Any = None) -> None:
        if isinstance(optimizer, DistributedOptimizer):
            if optimizer._gradient_compression is not None:
                raise ValueError("DistributedTrainer: give compression_params to DistributedTrainer, not to the "
                                 "DistributedOptimizer it would unwrap")
            optimizer = optimizer._optimizer
            warnings.warn("DistributedTrainer does not take a DistributedOptimizer: its optimizer was unwrapped",
                          stacklevel=2)
        if isinstance(root_rank, bool) or not isinstance(root_rank, int) or not 0 <= root_rank < size():
            raise ValueError(f"DistributedTrainer: root_rank must be a rank in 0..{size() - 1}, got {root_rank!r}")
        if gradient_predivide_factor <= 0:
            raise ValueError(f"gradient_predivide_factor must be > 0, got {gradient_predivide_factor}")
        if prefix is not None and not isinstance(prefix, str):
            raise ValueError(f"prefix must be a string, got {prefix!r}")
        if isinstance(compression_params, dict) and compression_params.get("compressor") \
                and gradient_predivide_factor != 1.0:
            raise ValueError("gradient_predivide_factor must be 1.0 with a compressor in compression_params: "
                             "compressed gradients are averaged before compression and summed in full precision")
        if process_set is not None and (compression_params or asynchronous()):
            raise ValueError("DistributedTrainer: a process_set with compression_params or asynchronous training "
                             "(BYTEPS_ENABLE_ASYNC) is not supported; average over every rank instead")
        # Horovod's: outside the set, or alone in it, a rank trains on its own
        self._process_set = process_set
        self._on_own = process_set is not None and (not process_set.included() or
                                                    len(rank_view(process_set).ranks) == 1)
        if process_set is not None and not self._on_own and root_rank not in rank_view(process_set).ranks:
            raise ValueError(f"DistributedTrainer: root_rank {root_rank} is not in the process set "
                             f"{list(rank_view(process_set).ranks)}")
        # Asynchronous: the parameters' changes go through the servers, no gradient does.
        self._async = ArrayExchange() if asynchronous() else None
        if self._async is not None:
            check_async_compression(compression_params, compression is None or compression is Compression.none)
        spec, self._gradient_compression, optimizer_params = take_compression_params(
            compression_params, optimizer, optimizer_params)
        self._compression = _cast_of(compression, spec)
        super().__init__(_sorted_parameters(params), optimizer, optimizer_params=optimizer_params, kvstore=None)
        self.root_rank = root_rank
        self._predivide = float(gradient_predivide_factor)
        self._batch_scale = 1.0  # step()'s 1/batch_size while its gradients go compressed (BytePS's order)
        self._prefix = prefix or ""
        for param in self._params:
            if param._stype != "default":
                raise ValueError(f"DistributedTrainer: parameter {param.name} is stored {param._stype}; byteps "
                                 "keeps weights dense (sparse_grad=True, a dense weight with row_sparse gradients, "
                                 "is supported)")
            if param._grad_stype not in ("default", "row_sparse"):
                raise ValueError(f"DistributedTrainer: parameter {param.name} has {param._grad_stype} gradients; "
                                 "byteps reduces dense and row_sparse ones")
            if len(param.list_ctx()) > 1:
                raise ValueError(f"DistributedTrainer: parameter {param.name} lives on {len(param.list_ctx())} "
                                 "contexts; byteps runs one device per worker process (launch one per device)")
        # Ids in a fixed order, whatever order the gradients become ready in.
        for param in self._params:
            byteps_declare_tensor(self._parameter_name(param))
            if param.grad_req != "null" and self._async is None:
                byteps_declare_tensor(self._gradient_name(param))
        for param in self._params:
            if self._on_own:
                continue
            if param._deferred_init:
                broadcast_after_init(param, root_rank, self._parameter_name(param), process_set)
            elif param._data is not None:
                broadcast_(param.list_data()[0], root_rank, name=self._parameter_name(param), process_set=process_set)

    def step(self, batch_size: float, ignore_stale_grad: bool = False) -> None:
        """gluon's ``step``; with a compressor in ``compression_params``, in BytePS's order.

        BytePS divides each gradient by the batch size before it is
        compressed and runs the optimizer with ``rescale_grad`` 1, so a codec
        that is not linear in its input (onebit without scaling: ``±1``
        whatever the scale) steps by the learning rate, not by the learning
        rate over the batch size. ``allreduce_grads()`` followed by
        ``update(batch_size)`` cannot know the batch size before the
        exchange: there the optimizer divides after it, as in BytePS.
        """
        if self._gradient_compression is None or self._async is not None or self._on_own:
            super().step(batch_size, ignore_stale_grad)
            return
        scale = self._scale
        self._batch_scale, self._scale = scale / batch_size, batch_size  # gluon's rescale_grad becomes 1
        try:
            super().step(batch_size, ignore_stale_grad)
        finally:
            self._batch_scale, self._scale = 1.0, scale

    def skip_step(self, batch_size: float) -> bool:
        """Backup workers (BYTEPS_BACKUP_WORKERS): step without computing when this worker is behind.

        When the answers of the last step said that the next round has
        already closed without this worker (the others went on without
        it), this takes that round's averaged gradients from the servers,
        steps with them (``step(batch_size)``, every trainable parameter
        updated) and returns True: skip this batch's forward and backward,
        as the others applied that round without it. Otherwise (in time, no
        backup workers, one worker, a compressor in ``compression_params``,
        a ``process_set``, asynchronous training) it returns False: compute
        as usual. It first waits for the last step's exchange (only its
        answers tell), which the next forward pass would wait for anyway.
        A slow worker then computes only the rounds it can still join, and
        the job goes at the pace of the others::

            for x, y in batches:
                if trainer.skip_step(batch_size):
                    continue
                with mx.autograd.record():
                    loss = loss_fn(net(x), y)
                loss.backward()
                trainer.step(batch_size)
        """
        if self._async is not None or self._process_set is not None or self._gradient_compression is not None:
            return False
        trainable = [param for param in self._params if param.grad_req != "null"]
        if self._params_to_init or rounds_behind(param.list_grad()[0] for param in trainable) < 1:
            return False
        skip_round(lambda: self.step(batch_size), trainable)
        return True

    def _parameter_name(self, param: Parameter) -> str:
        return parameter_name(param.name, self._prefix)

    def _gradient_name(self, param: Parameter) -> str:
        return f"{self._prefix}Gradient.{param.name}"

    def _init_params(self) -> None:
        """Broadcast the root's parameters; those still awaiting deferred initialisation wait for a later step."""
        deferred = []
        for param in self._params_to_init:
            if param._deferred_init:
                deferred.append(param)
                continue
            if self._on_own:
                continue
            arrays = param._check_and_get(param._data, list)
            broadcast_(arrays[0], self.root_rank, name=self._parameter_name(param), process_set=self._process_set)
        self._params_to_init = deferred

    def _allreduce_grads(self) -> None:
        """Average every gradient: large ones each as its own engine op, the small ones as one fused group.

        A large gradient's op starts as soon as backward has written it; the
        group (at most BYTEPS_FUSION_MAX_TENSOR_BYTES each, sent in buckets
        of BYTEPS_FUSION_THRESHOLD bytes) once all its gradients are written.
        Which gradients are small depends only on the parameters, so every
        rank builds the same group.

        With compression_params, the gradients the worker core compresses
        (at least BYTEPS_MIN_COMPRESS_BYTES, through servers) go with the
        spec and this step's learning rate (the core averages, then
        compresses each alone; up to a partition's size they share
        buckets); the others get their Nesterov momentum after the pull.
        """
        if self._async is not None or self._on_own:
            return  # each worker updates with its own gradients
        if self._process_set is not None:
            for index, param in enumerate(self._params):
                if param.grad_req != "null" and param._grad_stype == "row_sparse":
                    self._allreduce_densely(index, param, 1.0)
                elif param.grad_req != "null":
                    grad = param.list_grad()[0]
                    sent, ctx = self._compression.compress(grad)
                    name = self._gradient_name(param)
                    allreduce_(sent, average=True, name=name, priority=-index, prescale_factor=1.0 / self._predivide,
                               postscale_factor=self._predivide, process_set=self._process_set)
                    self._after_pull(name, grad, sent, ctx)
            return
        config, compression = api.worker().config, self._gradient_compression
        spec, lr = (compression.spec, float(self.learning_rate)) if compression is not None else (None, None)
        # step() with a compressor: divided by the batch size before compression (predivide is 1 then)
        prescale = self._batch_scale / self._predivide
        small: List[Tuple[int, Parameter, mx.nd.NDArray, mx.nd.NDArray, Any, bool]] = []
        row_sparse: List[Tuple[mx.nd.NDArray, Any]] = []
        for index, param in enumerate(self._params):
            if param.grad_req == "null":
                continue
            grad = param.list_grad()[0]
            if param._grad_stype == "row_sparse":  # never fused nor compressed (docs/sparse.md)
                if takes_row_sparse(grad, Average, None):
                    row_sparse.append((grad, start_row_sparse(grad, self._gradient_name(param), True,
                                                              self._batch_scale)))
                else:
                    self._allreduce_densely(index, param, prescale)
                continue
            sent, ctx = self._compression.compress(grad)
            nbytes = sent.size * np.dtype(sent.dtype).itemsize
            compressed = spec is not None and api.worker().compresses(nbytes, True, spec)
            # byteps-common's fusion packs compressed gradients apart, in buckets of one partition
            largest = config.partition_bytes if compressed else config.fusion_max_tensor_bytes
            if 0 < config.fusion_threshold and nbytes <= min(config.fusion_threshold, largest):
                small.append((index, param, grad, sent, ctx, compressed))
                continue
            name = self._gradient_name(param)
            allreduce_(sent, average=True, name=name, priority=-index, prescale_factor=prescale,
                       postscale_factor=self._predivide, compression_spec=spec if compressed else None,
                       lr=lr if compressed else None)
            self._after_pull(name, grad, sent, ctx)
        if len(small) == 1:
            index, param, grad, sent, ctx, compressed = small[0]
            allreduce_(sent, average=True, name=self._gradient_name(param), priority=-index,
                       prescale_factor=prescale, postscale_factor=self._predivide,
                       compression_spec=spec if compressed else None, lr=lr if compressed else None)
        elif small:
            allreduce_group_([member[3] for member in small], [self._gradient_name(member[1]) for member in small],
                             average=True, priority=-small[0][0], prescale_factor=prescale,
                             postscale_factor=self._predivide, compression_spec=spec, lr=lr)
        for _, param, grad, sent, ctx, _ in small:
            self._after_pull(self._gradient_name(param), grad, sent, ctx)
        for grad, started in row_sparse:
            started.finish().copyto(grad)

    def _allreduce_densely(self, index: int, param: Parameter, prescale: float) -> None:
        """A ``row_sparse`` gradient where the job has no row-sparse path (no servers, a process set, backup
        workers): averaged as a dense array (uncompressed), written back ``row_sparse``."""
        grad = param.list_grad()[0]
        dense = grad.tostype("default")
        allreduce_(dense, average=True, name=self._gradient_name(param), priority=-index, prescale_factor=prescale,
                   postscale_factor=self._predivide, process_set=self._process_set)
        dense.tostype("row_sparse").copyto(grad)

    def _after_pull(self, name: str, grad: mx.nd.NDArray, sent: mx.nd.NDArray, ctx: Any) -> None:
        """``grad`` = the averaged ``sent`` cast back; with compression_params, momentum where it went uncompressed."""
        if sent is not grad:
            self._compression.decompress(sent, ctx).copyto(grad)
        if self._gradient_compression is not None:
            self._gradient_compression.after_pull(name, grad, sent.size * np.dtype(sent.dtype).itemsize)

    def _update(self, ignore_stale_grad: bool = False) -> None:
        """gluon's update, after onebit's weight-decay momentum (compression_params with onebit and Nesterov).

        Here, not in :meth:`_allreduce_grads`, because it needs the
        ``rescale_grad`` of this update, which ``update(batch_size)`` sets
        after ``allreduce_grads()``.
        """
        if self._async is not None:
            self._update_asynchronously(ignore_stale_grad)
            return
        compression = self._gradient_compression
        if compression is not None and compression.wd:
            for index, param in enumerate(self._params):
                if param.grad_req == "null":
                    continue
                weight = param.list_data()[0]
                if ignore_stale_grad and not weight._fresh_grad:
                    continue  # gluon skips its update: its momentum waits too
                compression.add_weight_decay(self._gradient_name(param), param.list_grad()[0], weight,
                                             self._optimizer, index)
        super()._update(ignore_stale_grad)

    def _async_name(self, param: Parameter) -> str:
        return f"{self._prefix}{param.name}"

    def _update_asynchronously(self, ignore_stale_grad: bool) -> None:
        """gluon's own update on this worker's gradients, then every trainable parameter through the servers.

        The parameters trainable at the first update form one exchange
        (their push_pulls run together); one made trainable later gets an
        exchange of its own when it is met.
        """
        known = set(self._async.names)
        copies = {}
        for param in self._params:
            name = self._async_name(param)
            if param.grad_req != "null" or name in known:
                check_master_weights(self._optimizer, param.name, param.list_data()[0])
                copies[name] = param.list_data()
        if not known:
            self._async.group(list(copies))
        self._async.step(copies, lambda: super(DistributedTrainer, self)._update(ignore_stale_grad))
