"""Horovod's Keras callbacks: broadcast at the start, average metrics, warm up and schedule the learning rate;
and ours for backup workers (:class:`SkipStepCallback`).

Example::

    callbacks = [
        bps.callbacks.BroadcastGlobalVariablesCallback(0),
        bps.callbacks.MetricAverageCallback(),          # before callbacks that read the metrics
        bps.callbacks.LearningRateWarmupCallback(initial_lr=0.1 * bps.size(), warmup_epochs=3),
    ]
    model.fit(x, y, callbacks=callbacks, verbose=1 if bps.rank() == 0 else 0)
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Union

import numpy as np

from byteps.common import api
from byteps.common.frontend import size
from byteps.common.options import PushPullOptions
from byteps.tensorflow.functions import broadcast_variables
from byteps.tensorflow.gradient_tape import source_key
from byteps.tensorflow.keras.optimizer_state import build_optimizer, learning_rate, optimizer_variables
from byteps.tensorflow.which_keras import keras

__all__ = [
    "BroadcastGlobalVariablesCallback", "MetricAverageCallback",
    "LearningRateScheduleCallback", "LearningRateWarmupCallback", "SkipStepCallback",
]


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Give every rank the root's model and optimizer variables when training starts.

    If the model is built when ``fit`` starts (it has variables), the
    optimizer is built for its trainable variables right then (Keras's
    TensorFlow backend would otherwise build it while tracing the first
    step) and both are broadcast before the first step, so the first
    gradients already come from equal weights. Otherwise (a subclassed model
    not called yet) the broadcast happens after the first batch, as in
    Horovod. Only once per callback object. ``local_variables`` (a variable
    or a list; Horovod's) are left out: each rank keeps its own.
    """

    def __init__(self, root_rank: int, device: str = "", local_variables: Any = None) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False
        if local_variables is None:
            local_variables = []
        elif not isinstance(local_variables, (list, tuple, set)):
            local_variables = [local_variables]
        self.local_variables = {source_key(v) for v in local_variables}

    def _shared(self, variables: List[Any]) -> List[Any]:
        return [v for v in variables if source_key(v) not in self.local_variables]

    def _broadcast(self) -> None:
        model = self.model
        broadcast_variables(self._shared(model.variables), root_rank=self.root_rank)
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None:
            broadcast_variables(self._shared(optimizer_variables(optimizer)), root_rank=self.root_rank)
        self.broadcast_done = True

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        if self.broadcast_done or not self.model.built or not self.model.variables:
            return
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None:
            build_optimizer(optimizer, self.model.trainable_variables)
        self._broadcast()

    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if not self.broadcast_done:
            self._broadcast()


class MetricAverageCallback(keras.callbacks.Callback):
    """Average the epoch's metrics (``logs``) over all workers at the end of each epoch.

    Every numeric entry of ``logs`` is averaged in one push_pull (sorted by
    name, so every rank sends them in the same order). Put it before
    callbacks that read the metrics (ModelCheckpoint, EarlyStopping, ...).
    """

    def __init__(self, device: str = "") -> None:
        super().__init__()

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if logs is None or size() == 1:
            return
        names = sorted(k for k, v in logs.items() if np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype, np.number))
        if not names:
            return
        values = np.array([float(logs[k]) for k in names], dtype=np.float64)
        api.worker().push_pull(values, f"MetricAverageCallback.{len(names)}", PushPullOptions(average=True))
        logs.update({k: float(v) for k, v in zip(names, values)})


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Set the learning rate to ``initial_lr * multiplier(epoch)`` for epochs in [start_epoch, end_epoch).

    ``multiplier`` is a number or a function of the (fractional, unless
    ``staircase``) epoch; with ``staircase`` the rate changes at the first
    batch of each epoch, otherwise at every batch (``steps_per_epoch`` is
    then taken from ``fit`` when not given). ``momentum_correction`` scales
    the momentum buffers of momentum SGD by new_lr / old_lr when the rate
    changes (Goyal et al.), which is what Horovod's temporary momentum change
    does for plain momentum. The rate is logged as ``logs["lr"]``.
    """

    def __init__(self, initial_lr: float, multiplier: Union[float, Callable[[float], float]], start_epoch: int = 0,
                 end_epoch: Optional[int] = None, staircase: bool = True, momentum_correction: bool = True,
                 steps_per_epoch: Optional[int] = None) -> None:
        super().__init__()
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch: Optional[int] = None
        if not callable(multiplier):
            self.staircase = True
            constant = float(multiplier)
            self.multiplier: Callable[[float], float] = lambda epoch: constant
        else:
            self.multiplier = multiplier

    def _adjust_learning_rate(self, epoch: float) -> None:
        optimizer = self.model.optimizer
        old_lr = learning_rate(optimizer)
        new_lr = self.initial_lr * self.multiplier(epoch)
        optimizer.learning_rate = new_lr  # a TypeError from Keras if the optimizer has a schedule
        momentums = getattr(optimizer, "momentums", None)
        if self.momentum_correction and momentums and getattr(optimizer, "momentum", 0) and old_lr > 0 \
                and new_lr != old_lr:
            for buffer in momentums:
                buffer.assign(buffer * (new_lr / old_lr))

    def _in_range(self) -> bool:
        epoch = self.current_epoch if self.current_epoch is not None else 0
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        if self.initial_lr is None:
            self.initial_lr = learning_rate(self.model.optimizer)
        if not self.staircase and not self.steps_per_epoch:
            steps = (self.params or {}).get("steps")
            if not steps:
                raise ValueError(f"{type(self).__name__} could not tell the steps per epoch: pass steps_per_epoch")
            self.steps_per_epoch = steps

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if not self._in_range():
            return
        if self.staircase:
            if batch == 0:
                self._adjust_learning_rate(self.current_epoch)
        else:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if logs is not None:
            logs["lr"] = learning_rate(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramp the learning rate from ``initial_lr / size()`` to ``initial_lr`` over ``warmup_epochs`` (Goyal et al.).

    ``initial_lr`` is the rate after warmup (usually the single-worker rate
    times ``size()``). The rate grows every batch; with ``verbose`` the end
    of the warmup is printed.
    """

    def __init__(self, initial_lr: float, warmup_epochs: int = 5, momentum_correction: bool = True,
                 steps_per_epoch: Optional[int] = None, verbose: int = 0) -> None:
        def multiplier(epoch: float) -> float:
            # Shifted by one batch so that each epoch ends on a round value, as in Horovod.
            epoch += 1.0 / self.steps_per_epoch
            return 1.0 / size() * (epoch * (size() - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0:
            lr = learning_rate(self.model.optimizer)
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {lr:g}.", flush=True)


class SkipStepCallback(keras.callbacks.Callback):
    """Backup workers (BYTEPS_BACKUP_WORKERS=b, docs/async.md) in ``model.fit``: a worker that fell behind
    skips the batches of the rounds that closed without it.

    Before each batch it asks the model's byteps ``DistributedOptimizer``
    for :meth:`skip_step`; when that applied a closed round's averages, fit
    takes the batch from its iterator and drops it without running the train
    step (no forward or backward pass, no push), so a slow worker computes
    only the rounds it can still join and the job goes at the pace of the
    others. This is done by wrapping ``model.train_function`` for the
    duration of ``fit`` (Keras calls it once per batch, after the
    callbacks' ``on_train_batch_begin``): a callback alone cannot stop fit
    from computing a batch, and the optimizer is only reached after the
    forward and backward pass. The logs of a skipped batch are the model's
    metrics as they are. ``skipped`` counts the batches skipped (all ``fit``
    calls). Needs ``steps_per_execution=1`` and every worker with the same
    number of batches per epoch::

        model.compile(optimizer=bps.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
        model.fit(x, y, callbacks=[bps.callbacks.BroadcastGlobalVariablesCallback(0),
                                   bps.callbacks.SkipStepCallback()])
    """

    def __init__(self) -> None:
        super().__init__()
        self.skipped = 0
        self._wrapped: Any = None

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        model = self.model
        optimizer = model.optimizer
        if not callable(getattr(optimizer, "skip_step", None)) or not hasattr(optimizer, "_byteps_reducer"):
            raise ValueError("SkipStepCallback needs the model compiled with a byteps DistributedOptimizer, got "
                             f"{type(optimizer).__module__}.{type(optimizer).__name__}")
        steps = getattr(model, "steps_per_execution", None)
        if steps is None:  # Keras 2 keeps it in a variable
            steps = getattr(model, "_steps_per_execution", None)
        if steps is not None and int(np.asarray(steps)) != 1:
            raise ValueError(f"SkipStepCallback skips one batch at a time: compile with steps_per_execution=1, "
                             f"not {int(np.asarray(steps))}")
        inner = model.train_function
        self._wrapped = inner

        def train_function(iterator: Any) -> Any:
            if optimizer.skip_step():
                next(iterator)  # this batch's data goes unused, as the backup workers' work does in the paper
                self.skipped += 1
                return model.get_metrics_result()
            return inner(iterator)

        model.train_function = train_function

    def on_train_end(self, logs: Optional[Dict[str, Any]] = None) -> None:
        if self._wrapped is not None:
            self.model.train_function = self._wrapped
            self._wrapped = None
