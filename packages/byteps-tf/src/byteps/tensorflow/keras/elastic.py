"""Elastic training with Keras ``fit``: Horovod's ``hvd.elastic`` state and callbacks for byteps.keras.

::

    import byteps.keras as bps

    state = bps.elastic.KerasState(model, batch=0, epoch=0)
    callbacks = [bps.elastic.CommitStateCallback(state), bps.elastic.UpdateBatchStateCallback(state),
                 bps.elastic.UpdateEpochStateCallback(state)]

    @bps.elastic.run
    def train(state):
        model.fit(dataset, steps_per_epoch=..., epochs=epochs - state.epoch, callbacks=callbacks)

    train(state)
"""

from __future__ import annotations

from typing import Any

from byteps.tensorflow.elastic import TensorFlowKerasState, run
from byteps.tensorflow.which_keras import keras

__all__ = ["run", "KerasState", "CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback"]


class KerasState(TensorFlowKerasState):
    """The model's state (and its compiled optimizer's) plus plain values, as Horovod's ``KerasState``."""

    def __init__(self, model: Any, optimizer: Any = None, **kwargs: Any) -> None:
        super().__init__(model, optimizer=optimizer, **kwargs)


class CommitStateCallback(keras.callbacks.Callback):
    """``state.commit()`` every ``batches_per_commit`` batches and at the end of every epoch."""

    def __init__(self, state: Any, batches_per_commit: int = 1) -> None:
        super().__init__()
        if batches_per_commit < 1:
            raise ValueError(f"batches_per_commit must be >= 1, got {batches_per_commit}")
        self.state = state
        self.batches_per_commit = batches_per_commit
        self._left = batches_per_commit

    def on_train_begin(self, logs: Any = None) -> None:
        self._left = self.batches_per_commit  # the same count on every rank after a change of membership

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._left -= 1
        if self._left == 0:
            self.state.commit()
            self._left = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps ``state.batch`` at the batch just done (0 after an epoch); a restarted epoch runs only its rest."""

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state
        self._steps_per_epoch = None

    def on_train_begin(self, logs: Any = None) -> None:
        self._steps_per_epoch = None

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        steps = self.params.get("steps") if self.params else None
        if steps:
            if self._steps_per_epoch is None:
                self._steps_per_epoch = steps
            self.params["steps"] = self._steps_per_epoch - self.state.batch

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.state.batch = batch

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keeps ``state.epoch`` counting epochs across changes of membership (Keras restarts at 0 in each fit)."""

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state
        self._initial_epoch = state.epoch

    def on_train_begin(self, logs: Any = None) -> None:
        self._initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.state.epoch = self._initial_epoch + epoch + 1
