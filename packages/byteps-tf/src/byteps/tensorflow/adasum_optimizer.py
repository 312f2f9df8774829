"""Horovod's Adasum delta optimizer for TF1 optimizers: ``DistributedOptimizer(opt, op=bps.Adasum)``.

Adasum combines what the workers *did*, not their gradients: each worker
applies its own gradients with the wrapped optimizer (a local step, its
slots and learning rate as they are), and every
``backward_passes_per_step``-th step the change since the last combination,
``delta = var - start``, is combined over the workers with Adasum
(:mod:`byteps.common.frontend.adasum`); then ``start += adasum(delta)`` and
``var = start`` on every worker. ``start`` is set from the variable at the
first step, so broadcast the variables before it (as always). Example::

    opt = bps.DistributedOptimizer(tf.compat.v1.train.AdamOptimizer(0.001), op=bps.Adasum)
    opt.minimize(loss_fn, var_list=variables)      # eager, tf.function or a TF1 graph

Horovod's ``_DistributedAdasumOptimizer`` describes these semantics, but
its ``apply_gradients`` hands the call to the wrapped optimizer, so
``minimize``/``apply_gradients`` step locally and never combine; this one
does what that class documents. As in Horovod: ``compute_gradients``
returns this worker's own gradients; ``backward_passes_per_step=N`` takes N
local steps between combinations (not N accumulated passes), and
``average_aggregated_gradients`` is refused. Only the variables that got a
gradient in a step are stepped and combined; pass the same variables every
step. The ``start`` copies and the step counter are plain variables outside
the wrapped optimizer (not in its ``variables()``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import tensorflow as tf

from byteps.tensorflow.gradients import GradientReducer

__all__ = ["DistributedAdasumV1Optimizer"]


def _after(effects: Sequence[Any], value: tf.Tensor) -> tf.Tensor:
    """``value`` once ``effects`` ran (a TF1 graph runs only what a fetched tensor depends on)."""
    effects = [effect for effect in effects if effect is not None]
    if tf.executing_eagerly() or not effects:
        return value
    with tf.control_dependencies(effects):
        return tf.identity(value)


class DistributedAdasumV1Optimizer(tf.compat.v1.train.Optimizer):
    """A TF1 optimizer that steps locally and combines the variables' changes with Adasum (module doc)."""

    def __init__(self, optimizer: tf.compat.v1.train.Optimizer, name: Optional[str], use_locking: bool,
                 reducer: GradientReducer, backward_passes_per_step: int = 1) -> None:
        self._optimizer = optimizer
        self._reducer = reducer  # op=Adasum: the deltas' combination, named "<prefix>.<i>"
        self._passes = backward_passes_per_step
        self._starts: Dict[Any, tf.Variable] = {}  # a variable's ref: its value after the last combination
        self._steps: Optional[tf.Variable] = None
        super().__init__(name=name or f"DistributedDelta{type(optimizer).__name__}", use_locking=use_locking)

    def skip_step(self, session: Any = None, global_step: Any = None) -> bool:
        """Backup workers: always False (compute the step), as an Adasum round waits for every rank."""
        return False

    def compute_gradients(self, *args: Any, **kwargs: Any) -> Any:
        """This worker's own gradients (the wrapped optimizer's)."""
        return self._optimizer.compute_gradients(*args, **kwargs)

    def _state_for(self, variables: List[Any]) -> List[tf.Variable]:
        # init_scope: made while a tf.function is traced, they must outlive its graph (as slots do).
        with tf.init_scope():
            if self._steps is None:
                self._steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="byteps_adasum_steps")
            for variable in variables:
                if variable.ref() not in self._starts:
                    self._starts[variable.ref()] = tf.Variable(
                        tf.zeros(variable.shape, dtype=variable.dtype.base_dtype), trainable=False,
                        name="byteps_adasum_start")
        return [self._starts[variable.ref()] for variable in variables]

    def apply_gradients(self, grads_and_vars: Any, global_step: Any = None, name: Optional[str] = None) -> Any:
        """The wrapped optimizer's local step; every ``backward_passes_per_step``-th step, then, the Adasum
        combination of the variables' changes since the previous one."""
        pairs = list(grads_and_vars)
        variables = [variable for gradient, variable in pairs if gradient is not None]
        if not variables:  # TF1's own error for no gradients
            return self._optimizer.apply_gradients(pairs, global_step=global_step, name=name)
        starts = self._state_for(variables)
        steps = self._steps

        def begin() -> tf.Tensor:
            return _after([start.assign(variable, read_value=False) for start, variable in zip(starts, variables)],
                          tf.constant(True))

        began = tf.cond(tf.equal(steps.read_value(), 0), begin, lambda: tf.constant(False))
        with tf.control_dependencies([began]):
            stepped = self._optimizer.apply_gradients(pairs, global_step=global_step, name=name)
        with tf.control_dependencies([stepped] if stepped is not None and not tf.executing_eagerly() else []):
            due = tf.equal(steps.read_value() % self._passes, self._passes - 1)

        def combine() -> tf.Tensor:
            deltas = [tf.convert_to_tensor(variable) - start for start, variable in zip(starts, variables)]
            combined = self._reducer.reduce(deltas)
            assigned = []
            for start, variable, change in zip(starts, variables, combined):
                new_start = start.assign_add(change)
                assigned.append(variable.assign(new_start, read_value=False))
            return _after(assigned, tf.constant(True))

        combined = tf.cond(due, combine, lambda: tf.constant(False))
        with tf.control_dependencies([combined]):
            counted = steps.assign_add(1, read_value=False)
        return counted

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.variables(*args, **kwargs)
