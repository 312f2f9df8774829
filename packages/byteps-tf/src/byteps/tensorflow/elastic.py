"""Elastic training for TensorFlow 2 / Keras 3: Horovod's ``hvd.elastic`` over byteps' membership epochs.

Run under ``bpslaunch -np 3 --min-np 2 --max-np 3 python train.py`` (docs/elastic.md)::

    import byteps.tensorflow as bps

    bps.init()
    model, optimizer = ..., ...
    state = bps.elastic.TensorFlowKerasState(model, optimizer, epoch=0, batch=0)

    @bps.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...  # steps with bps.DistributedGradientTape, state.commit() every few
            state.batch = 0

    train(state)

Eager execution only (TF2): TF1 sessions (Horovod's ``TensorFlowState``
with a session) are refused. A collective that fails because the job lost
a process raises :class:`~byteps.tensorflow.reduction.JobLostError`
eagerly and ``tf.errors.AbortedError`` from inside a ``tf.function``;
``run`` recognizes both.
"""

from __future__ import annotations

import functools
from typing import Any, List, Optional

import tensorflow as tf

from byteps.common import JobLost
from byteps.common.elastic import HostsUpdatedInterrupt, ObjectState, run_fn
from byteps.common.elastic import State as _State
from byteps.common.frontend.process import rank
from byteps.tensorflow.functions import broadcast_object, broadcast_variables
from byteps.tensorflow.reduction import JOB_LOST_MARK

__all__ = ["run", "TensorFlowKerasState", "TensorFlowState", "ObjectState", "State", "HostsUpdatedInterrupt"]

State = _State


def run(func: Any) -> Any:
    """Horovod's ``hvd.elastic.run``: ``func(state, ...)`` goes on across lost and added workers."""

    @functools.wraps(func)
    def graph_errors_as_lost(state: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(state, *args, **kwargs)
        except tf.errors.AbortedError as exc:  # a JobLostError that came out of a graph
            if JOB_LOST_MARK in (exc.message or "") and not isinstance(exc, JobLost):
                raise JobLost(exc.message) from exc
            raise

    return run_fn(graph_errors_as_lost)


def _values(variables: List[Any]) -> List[Any]:
    return [v.numpy() for v in variables]


def _assign(variables: List[Any], values: List[Any]) -> None:
    if len(variables) != len(values):
        raise RuntimeError(f"elastic state: {len(variables)} variables now, {len(values)} when it was saved; "
                           "build the model and the optimizer before creating the state")
    for variable, value in zip(variables, values):
        variable.assign(value)


class _VariablesState(ObjectState):
    """TensorFlow variables (``_variables()``, the subclass's) plus plain values: saved as numpy copies,
    restored by assignment, synced by a broadcast from rank 0."""

    def __init__(self, **kwargs: Any) -> None:
        self._saved_variables = _values(self._variables())
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def _variables(self) -> List[Any]:
        raise NotImplementedError

    def save(self) -> None:
        self._saved_variables = _values(self._variables())
        super().save()

    def restore(self) -> None:
        _assign(self._variables(), self._saved_variables)
        super().restore()

    def sync(self) -> None:
        broadcast_variables(self._variables(), root_rank=0)
        self._saved_variables = _values(self._variables())
        super().sync()


class TensorFlowState(_VariablesState):
    """Horovod's ``TensorFlowState`` for eager TensorFlow: a list of variables plus plain values."""

    def __init__(self, variables: Optional[List[Any]] = None, session: Any = None, **kwargs: Any) -> None:
        if session is not None:
            raise ValueError("TensorFlowState(session=...): byteps' elastic training runs eagerly (TF2); "
                             "TF1 sessions are not supported")
        self.variables = list(variables or [])
        super().__init__(**kwargs)

    def _variables(self) -> List[Any]:
        return self.variables


class TensorFlowKerasState(_VariablesState):
    """Horovod's ``TensorFlowKerasState``: a Keras model, its optimizer and plain values (``epoch=0``).

    The optimizer is built on the model's trainable variables here if it is
    not yet, so that every rank, a newcomer too, has the same optimizer
    variables to save and to broadcast.
    """

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None, **kwargs: Any) -> None:
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        if self.optimizer is not None and model.built:
            from byteps.tensorflow.keras.optimizer_state import build_optimizer
            build_optimizer(self.optimizer, model.trainable_variables)
        super().__init__(**kwargs)

    def _variables(self) -> List[Any]:
        variables = list(self.model.variables)
        if self.optimizer is not None:
            from byteps.tensorflow.keras.optimizer_state import optimizer_variables
            variables += optimizer_variables(self.optimizer)
        return variables
