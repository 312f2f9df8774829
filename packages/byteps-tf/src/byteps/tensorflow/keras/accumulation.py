"""Local sums of N backward passes' gradients, for ``DistributedOptimizer(backward_passes_per_step=N)``.

The sums and the pass counter are plain ``tf.Variable`` objects held by
the distributed optimizer *outside* Keras's tracking: they are not among
``optimizer.variables``, so they are neither saved nor broadcast, and the
wrapped optimizer keeps exactly the variables (iteration count, momentum,
Adam's moments) of the optimizer it copies. A model saved during training
therefore loads with its optimizer state into a plain Keras optimizer, or
into a distributed one with any ``backward_passes_per_step``; Keras skips
the whole optimizer state when the counts of variables differ. Horovod
keeps its aggregation variables outside the optimizer as well.

Two ways to use it (``slots[i]`` is the position of gradient *i*'s
variable in the list the accumulator was built for)::

    accumulator = BackwardPassAccumulator(model.trainable_variables, passes=2)
    # Keras 3: add, and every N-th pass reduce and apply, in one step
    accumulator.apply_every(gradients, slots, average=False, apply=optimizer_update)   # a tf.bool: applied
    # Keras 2, Horovod's order: compute_gradients adds (and every N-th pass reduces),
    # apply_gradients applies after a reducing pass and only counts the others
    gradients = accumulator.reduce_every(gradients, slots, average=False, reduce=allreduce)
    accumulator.apply_when_due(optimizer_update, optimizer.iterations)

``counter`` is the number of passes added since the last reduction (the
name Horovod's aggregation helper gives it).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import tensorflow as tf

__all__ = ["BackwardPassAccumulator"]


def _track_in_keras_session(variables: Sequence[Any]) -> None:
    """A TF1 graph (eager execution disabled, Keras 2's graph training): Keras initializes in its session
    only the variables it tracks, and these are outside the optimizer's. Keras 3 has no such mode."""
    try:
        from tf_keras.src.backend import track_variable  # Keras 2's own, not in its public API
    except ImportError:
        return
    for variable in variables:
        track_variable(variable)


def _after(effects: Sequence[Any], value: tf.Tensor) -> tf.Tensor:
    """``value``, once ``effects`` have run. Inside ``tf.function`` TensorFlow orders side effects itself; a
    TF1 graph (Keras 2 with eager execution disabled) runs only what a fetched tensor depends on."""
    effects = [e for e in effects if e is not None]
    if tf.executing_eagerly() or not effects:
        return value
    with tf.control_dependencies(effects):
        return tf.identity(value)


class BackwardPassAccumulator:
    """One zero-initialised sum per model variable and a count of the passes added since the last reset."""

    def __init__(self, variables: Sequence[Any], passes: int) -> None:
        self.passes = passes
        # init_scope: the optimizer may be built while a tf.function is traced;
        # the variables must outlive that graph, as Keras's own slots do.
        with tf.init_scope():
            self.sums = [tf.Variable(tf.zeros(v.shape, dtype=tf.as_dtype(v.dtype)), trainable=False,
                                     name="byteps_accumulator") for v in variables]
            self.counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="byteps_backward_passes")
            if not tf.executing_eagerly():
                _track_in_keras_session((*self.sums, self.counter))

    def add(self, gradients: Sequence[Optional[Any]], slots: Sequence[int]) -> tf.Tensor:
        """Add ``gradients[i]`` to sum ``slots[i]`` (``None`` adds nothing); True once ``passes`` were added."""
        updates = []
        for gradient, slot in zip(gradients, slots):
            if gradient is None:
                continue
            total = self.sums[slot]
            if isinstance(gradient, tf.IndexedSlices):
                updates.append(total.scatter_add(tf.IndexedSlices(tf.cast(gradient.values, total.dtype),
                                                                  gradient.indices, gradient.dense_shape)))
            else:
                updates.append(total.assign_add(tf.cast(gradient, total.dtype), read_value=False))
        updates.append(self.counter.assign_add(1, read_value=False))
        # Explicit: a TF1 graph (Keras 2 with eager execution disabled) orders nothing by itself.
        with tf.control_dependencies(updates):
            return self.counter.read_value() >= self.passes

    def totals(self, slots: Sequence[int], present: Sequence[bool], average: bool) -> List[Optional[tf.Tensor]]:
        """The sums of ``slots`` (``None`` where no pass had a gradient), divided by ``passes`` if ``average``."""
        totals: List[Optional[tf.Tensor]] = []
        for slot, there in zip(slots, present):
            if not there:
                totals.append(None)
                continue
            total = tf.convert_to_tensor(self.sums[slot])
            totals.append(total / tf.cast(self.passes, total.dtype) if average else total)
        return totals

    def reset(self) -> List[Any]:
        """Zero the sums and the counter; the assignments (for a graph to depend on)."""
        updates = [total.assign(tf.zeros_like(total), read_value=False) for total in self.sums]
        return updates + [self.counter.assign(0, read_value=False)]

    def apply_every(self, gradients: Sequence[Optional[Any]], slots: Sequence[int], average: bool,
                    apply: Callable[[List[Optional[tf.Tensor]]], Any]) -> tf.Tensor:
        """Add ``gradients``; on every ``passes``-th call, ``apply(totals)`` and reset, inside one ``tf.cond``
        (eager or in a graph). True when it applied."""
        present = [g is not None for g in gradients]

        def update() -> tf.Tensor:
            apply(self.totals(slots, present, average))
            self.reset()
            return tf.constant(True)

        return tf.cond(self.add(gradients, slots), update, lambda: tf.constant(False))

    def reduce_every(self, gradients: Sequence[Optional[Any]], slots: Sequence[int], average: bool,
                     reduce: Callable[[List[Any]], List[Any]]) -> List[Optional[Any]]:
        """Add ``gradients``; on every ``passes``-th call return ``reduce(totals)`` and reset, on the others
        the running sums (what Horovod's helper returns). ``None`` stays ``None``."""
        present = [g is not None for g in gradients]
        there = [i for i, p in enumerate(present) if p]
        due = self.add(gradients, slots)

        def reduced() -> List[tf.Tensor]:
            totals = reduce(self.totals(slots, present, average))
            outputs = [tf.convert_to_tensor(totals[i]) for i in there] or [tf.constant(True)]
            with tf.control_dependencies(outputs):   # zeroed once read
                cleared = self.reset()
            return [_after(cleared, output) for output in outputs]

        def running() -> List[tf.Tensor]:
            totals = self.totals(slots, present, False)
            return [totals[i] for i in there] or [tf.constant(False)]

        # Only tensors go through the tf.cond (not None), and back to their places afterwards.
        results: List[Optional[Any]] = [None] * len(gradients)
        for i, value in zip(there, tf.cond(due, reduced, running)):
            results[i] = value
        return results

    def apply_when_due(self, apply: Callable[[], Any], iterations: Any, after: Sequence[Any] = ()) -> tf.Tensor:
        """After :meth:`reduce_every` (whose results are ``after``): ``apply()`` on a pass that reduced (the
        counter is back at 0); on the others add 1 to ``iterations`` (if not None: a TF1 ``global_step``
        may be) instead, as Horovod does (it counts backward passes). True when applied."""
        def update() -> tf.Tensor:
            return _after([apply()], tf.constant(True))

        def count() -> tf.Tensor:
            if iterations is None:
                return tf.constant(False)
            return _after([iterations.assign_add(1, read_value=False)], tf.constant(False))

        with tf.control_dependencies([t for t in after if isinstance(t, tf.Tensor)]):
            due = tf.equal(self.counter.read_value(), 0)
        return tf.cond(due, update, count)
