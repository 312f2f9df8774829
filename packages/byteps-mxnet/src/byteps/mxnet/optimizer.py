"""DistributedOptimizer: an MXNet optimizer whose updates use gradients averaged over all ranks.

For the Module API and for gluon Trainers built with ``kvstore=None``: each
``update(index, weight, grad, state)`` first push_pulls ``grad`` in place
(name ``"Gradient.<index>"``, priority ``-index``, as in BytePS), then runs
the wrapped optimizer's update. MXNet's aggregated updates (lists of
indices) push_pull their gradients as one group, small ones fused (a
process set's each alone). Both are engine ops, so the update waits for
the average without blocking Python. With gluon, prefer
:class:`~byteps.mxnet.DistributedTrainer`, which also broadcasts the
parameters.

Example::

    opt = bps.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.01 * bps.size()))
    trainer = mx.gluon.Trainer(net.collect_params(), opt, kvstore=None)
    module.init_optimizer(kvstore=None, optimizer=opt)

Attributes are read from and written to the wrapped optimizer, so a
Trainer setting ``rescale_grad`` or ``param_dict`` on the wrapper reaches it.

``compression_params`` (BytePS's gradient compression, docs/compression.md)
works here as on :class:`~byteps.mxnet.DistributedTrainer`::

    opt = bps.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9),
                                   compression_params={"compressor": "onebit", "ef": "vanilla",
                                                       "momentum": "nesterov"})

With BYTEPS_ENABLE_ASYNC=1 (on every process) ``update()`` trains
asynchronously, as BytePS does: the wrapped optimizer updates the weight
with this worker's own gradient (no push_pull, no division by the number
of workers), then the weight's change goes to the servers under
``"AsyncParameter.Weight.<index>"`` and the servers' value replaces the
weight; a weight's first update first broadcasts rank 0's value into the
servers (:mod:`byteps.mxnet.async_training`). Each index is exchanged on
its own and ``update()`` waits for it. The mode is read when the optimizer
is wrapped (at its first update if it was wrapped before ``init()``).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import mxnet as mx
import numpy as np

from byteps.common import api
from byteps.common.frontend.async_training import check_async_compression
from byteps.common.frontend.process_sets import rank_view
from byteps.mxnet.async_training import ArrayExchange, asynchronous, check_master_weights
from byteps.mxnet.backup_workers import rounds_behind, skip_round
from byteps.mxnet.gradient_compression import take_compression_params
from byteps.mxnet.ops import allreduce_, allreduce_group_

__all__ = ["DistributedOptimizer"]

#: Attributes that live on the wrapper itself; everything else is the wrapped optimizer's.
_OWN = ("_optimizer", "_predivide", "_gradient_compression", "_async", "_process_set", "_last_grads")

#: ``_async`` before the training mode is known (wrapped before ``init()``).
_UNDECIDED = object()


class DistributedOptimizer(mx.optimizer.Optimizer):
    """Wraps ``optimizer`` (Horovod's and BytePS's ``DistributedOptimizer``).

    ``gradient_predivide_factor`` (Horovod) divides gradients by the factor
    before the sum and multiplies the average by it after, for numerical
    range; the result is the same average (nothing to act on in asynchronous
    training). ``num_groups`` is accepted for Horovod compatibility and ignored.
    ``process_set`` (Horovod's): gradients are averaged over its ranks only;
    a rank outside it, or a set of one rank, updates with its own gradient.

    ``compression_params``: BytePS's dict with a compressor (without
    ``fp16``, which is DistributedTrainer's: a ValueError here). Every gradient is pushed with the optimizer's current
    ``learning_rate``; ``"momentum": "nesterov"`` takes ``optimizer.momentum``
    and sets it to 0.0 (wrap the optimizer before its first update, which
    creates its momentum state), and with ``onebit`` its ``wd`` too, which
    comes back with its own momentum in each update, as in BytePS.
    """

    def __init__(self, optimizer: mx.optimizer.Optimizer, gradient_predivide_factor: float = 1.0,
                 num_groups: int = 0, compression_params: Optional[Dict[str, Any]] = None,
                 process_set: Any = None) -> None:
        # No super().__init__: this object holds no optimizer state of its own.
        if not isinstance(optimizer, mx.optimizer.Optimizer):
            raise TypeError(f"DistributedOptimizer wraps an mxnet Optimizer, got {type(optimizer).__name__}")
        if asynchronous():  # first: nothing below, e.g. a compressor taking the momentum, applies then
            check_async_compression(compression_params)
        if gradient_predivide_factor <= 0:
            raise ValueError(f"gradient_predivide_factor must be > 0, got {gradient_predivide_factor}")
        if isinstance(compression_params, dict) and compression_params and gradient_predivide_factor != 1.0:
            raise ValueError("gradient_predivide_factor must be 1.0 with compression_params: compressed gradients "
                             "are averaged before compression and summed in full precision")
        if isinstance(compression_params, dict) and compression_params.get("fp16"):
            raise ValueError("DistributedOptimizer: compression_params['fp16'] is DistributedTrainer's (or "
                             "compression=Compression.fp16 there); the optimizer updates with the gradient it is given")
        if process_set is not None and compression_params:
            raise ValueError("DistributedOptimizer: compression_params with a process_set is not supported; "
                             "compressed gradients are averaged over every rank")
        _, compression, _ = take_compression_params(compression_params, optimizer, None)
        object.__setattr__(self, "_optimizer", optimizer)
        object.__setattr__(self, "_predivide", float(gradient_predivide_factor))
        object.__setattr__(self, "_gradient_compression", compression)
        object.__setattr__(self, "_async", _UNDECIDED)
        object.__setattr__(self, "_process_set", process_set)
        object.__setattr__(self, "_last_grads", {})  # index -> the gradient last push_pulled (skip_step waits)
        self._asynchronous_exchange()

    def __getattr__(self, item: str) -> Any:
        if item in _OWN:  # not set yet (unpickling): no recursion through the wrapped optimizer
            raise AttributeError(item)
        return getattr(self._optimizer, item)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self._optimizer, name, value)

    def __getstate__(self) -> dict:
        return {"optimizer": self._optimizer, "predivide": self._predivide,
                "compression": self._gradient_compression}  # a process set is this job's: not kept

    def __setstate__(self, state: dict) -> None:
        object.__setattr__(self, "_optimizer", state["optimizer"])
        object.__setattr__(self, "_predivide", state["predivide"])
        object.__setattr__(self, "_gradient_compression", state.get("compression"))
        object.__setattr__(self, "_async", _UNDECIDED)  # the exchange holds no state worth saving: decided anew
        object.__setattr__(self, "_process_set", None)
        object.__setattr__(self, "_last_grads", {})

    @property
    def learning_rate(self) -> float:
        return self._optimizer.learning_rate

    def create_state(self, index: Any, weight: mx.nd.NDArray) -> Any:
        return self._optimizer.create_state(index, weight)

    def create_state_multi_precision(self, index: Any, weight: mx.nd.NDArray) -> Any:
        return self._optimizer.create_state_multi_precision(index, weight)

    def _push_pull(self, index: Any, grad: Any, prescale: float = 1.0) -> None:
        process_set = self._process_set
        if process_set is not None and (not process_set.included() or len(rank_view(process_set).ranks) == 1):
            return  # Horovod's: outside the set (or alone in it) a rank keeps its own gradient
        if isinstance(index, (tuple, list)) and process_set is not None:
            for i, g in zip(index, grad):  # a process set's gradients each go alone, as in DistributedTrainer
                self._push_pull(i, g, prescale)
            return
        if isinstance(index, (tuple, list)):  # MXNet's aggregated updates pass lists: one fused group
            self._push_pull_group(list(index), list(grad), prescale)
            return
        priority = -index if isinstance(index, int) else 0
        name = f"Gradient.{index}"
        self._last_grads[index] = grad
        compression = self._gradient_compression
        if compression is None:
            allreduce_(grad, average=True, name=name, priority=priority,
                       prescale_factor=1.0 / self._predivide, postscale_factor=self._predivide,
                       process_set=process_set)
            return
        allreduce_(grad, average=True, name=name, priority=priority, compression_spec=compression.spec,
                   lr=float(self._optimizer.learning_rate), prescale_factor=prescale)
        compression.after_pull(name, grad, grad.size * np.dtype(grad.dtype).itemsize)

    def _push_pull_group(self, indices: List[Any], grads: List[Any], prescale: float) -> None:
        """An aggregated update's gradients as one engine op, small ones fused (byteps-common's grouped call)."""
        names = [f"Gradient.{i}" for i in indices]
        self._last_grads.update(zip(indices, grads))
        first = indices[0] if indices and isinstance(indices[0], int) else 0
        compression = self._gradient_compression
        if compression is None:
            allreduce_group_(grads, names, average=True, priority=-first, prescale_factor=1.0 / self._predivide,
                             postscale_factor=self._predivide)
            return
        allreduce_group_(grads, names, average=True, priority=-first, prescale_factor=prescale,
                         compression_spec=compression.spec, lr=float(self._optimizer.learning_rate))
        for name, grad in zip(names, grads):
            compression.after_pull(name, grad, grad.size * np.dtype(grad.dtype).itemsize)

    def _add_weight_decay(self, index: Any, weight: Any, grad: Any) -> None:
        compression = self._gradient_compression
        if compression is None or not compression.wd:
            return
        if isinstance(index, (tuple, list)):
            for i, w, g in zip(index, weight, grad):
                self._add_weight_decay(i, w, g)
            return
        compression.add_weight_decay(f"Gradient.{index}", grad, weight, self._optimizer, index)

    def _asynchronous_exchange(self) -> Optional[ArrayExchange]:
        """The exchange when training asynchronously, else None; decided once byteps is initialized."""
        if self._async is _UNDECIDED and api.is_initialized():
            exchange = None
            if asynchronous():
                check_async_compression(None, self._gradient_compression is None)
                exchange = ArrayExchange()
            object.__setattr__(self, "_async", exchange)
        return None if self._async is _UNDECIDED else self._async

    def _update_asynchronously(self, exchange: ArrayExchange, index: Any, weight: Any,
                               update: Callable[[], None]) -> None:
        """The wrapped optimizer's update, then each weight's change out and the servers' value in."""
        indices, weights = (index, weight) if isinstance(index, (tuple, list)) else ((index,), (weight,))
        copies = {}
        for i, w in zip(indices, weights):
            name = f"Weight.{i}"
            check_master_weights(self._optimizer, name, w)
            copies[name] = [w]
        exchange.step(copies, update)

    def update(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        exchange = self._asynchronous_exchange()
        if exchange is not None:
            self._update_asynchronously(exchange, index, weight,
                                        lambda: self._optimizer.update(index, weight, grad, state))
            return
        self._exchange_and_update(index, weight, grad, state, self._optimizer.update)

    def update_multi_precision(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        exchange = self._asynchronous_exchange()
        if exchange is not None:
            self._update_asynchronously(exchange, index, weight,
                                        lambda: self._optimizer.update_multi_precision(index, weight, grad, state))
            return
        self._exchange_and_update(index, weight, grad, state, self._optimizer.update_multi_precision)

    def _exchange_and_update(self, index: Any, weight: Any, grad: Any, state: Any,
                             update: Callable[[Any, Any, Any, Any], None]) -> None:
        """Average ``grad`` over the ranks, then the wrapped optimizer's ``update``.

        With a compressor, in BytePS's order: the gradient is multiplied by
        ``rescale_grad`` (gluon's 1/batch size) before it is compressed, and
        the optimizer runs with ``rescale_grad`` 1 (onebit without scaling
        then steps by the learning rate, as BytePS's trainer does).
        """
        scale = float(self._optimizer.rescale_grad) if self._gradient_compression is not None else 1.0
        self._push_pull(index, grad, scale)
        if scale == 1.0:
            self._add_weight_decay(index, weight, grad)
            update(index, weight, grad, state)
            return
        self._optimizer.rescale_grad = 1.0  # read when the update op is issued: restored right after
        try:
            self._add_weight_decay(index, weight, grad)
            update(index, weight, grad, state)
        finally:
            self._optimizer.rescale_grad = scale

    def skip_step(self, owner: Any, batch_size: Optional[float] = None) -> bool:
        """Backup workers (BYTEPS_BACKUP_WORKERS): step without computing when this worker is behind.

        ``owner`` is what updates through this optimizer: a gluon
        ``Trainer`` built with ``kvstore=None`` (then ``batch_size`` is
        its ``step``'s) or a Module (``module.update()``). When the answers
        of the last update said that the next round has already closed
        without this worker, this takes that round's averaged gradients
        from the servers, updates with them (every trainable parameter) and
        returns True: skip this batch's forward and backward. Otherwise (in
        time, no backup workers, one worker, ``compression_params``, a
        ``process_set``, asynchronous training) it returns False: compute
        as usual. See :meth:`byteps.mxnet.DistributedTrainer.skip_step`,
        the same for gluon with the parameters' broadcast::

            trainer = mx.gluon.Trainer(net.collect_params(), opt, kvstore=None)
            for x, y in batches:
                if opt.skip_step(trainer, batch_size):
                    continue
                ...                                   # forward, backward
                trainer.step(batch_size)

            if opt.skip_step(module):                 # the Module API
                continue
        """
        step, params = self._skipped_update(owner, batch_size)
        if self._async is not None or self._process_set is not None or self._gradient_compression is not None:
            return False
        if rounds_behind(self._last_grads.values()) < 1:
            return False
        skip_round(step, params)
        return True

    def _skipped_update(self, owner: Any, batch_size: Optional[float]) -> tuple:
        """What skip_step runs for ``owner`` and the gluon Parameters whose gradients it marks fresh."""
        from byteps.mxnet.trainer import DistributedTrainer

        if isinstance(owner, DistributedTrainer):
            raise ValueError("DistributedOptimizer.skip_step: a DistributedTrainer does not update through a "
                             "DistributedOptimizer; call trainer.skip_step(batch_size) instead")
        if getattr(owner, "_optimizer", None) is not self:
            raise ValueError(f"DistributedOptimizer.skip_step: pass the gluon Trainer (kvstore=None) or the Module "
                             f"that updates through this optimizer, got {type(owner).__name__} that does not")
        if isinstance(owner, mx.gluon.Trainer):
            if batch_size is None:
                raise ValueError("DistributedOptimizer.skip_step(trainer, batch_size): the batch_size of the "
                                 "trainer's step() is needed, it rescales the averaged gradients")
            return (lambda: owner.step(batch_size)), owner._params
        if batch_size is not None:
            raise ValueError("DistributedOptimizer.skip_step(module): a Module's update() takes no batch_size; "
                             "leave it out")
        return owner.update, ()

    def set_learning_rate(self, lr: float) -> None:
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult: dict) -> None:
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult: dict) -> None:
        self._optimizer.set_wd_mult(args_wd_mult)
