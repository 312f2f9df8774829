"""DistributedOptimizer for Keras 2 optimizers (tf_keras, with ``TF_USE_LEGACY_KERAS=1``).

Both of Keras 2's optimizer families are wrapped: ``tf.keras.optimizers``
(2.11 and later) and ``tf.keras.optimizers.legacy`` (OptimizerV2, what
most Horovod scripts were written against)::

    os.environ["TF_USE_LEGACY_KERAS"] = "1"      # before TensorFlow is imported; or in the shell
    import tensorflow as tf
    import byteps.tensorflow.keras as bps

    opt = bps.DistributedOptimizer(tf.keras.optimizers.legacy.Adam(0.001 * bps.size()))
    model.compile(optimizer=opt, loss="mse")

As with Keras 3 the result is a copy of the optimizer (from its config) of
a subclass of its class. Every update of both families goes through
``apply_gradients`` (``model.fit``, ``minimize``, ``train_on_batch`` and
custom loops alike), so that is where the gradients are averaged, before
the optimizer sees them. ``backward_passes_per_step=N`` sums N passes
locally and applies every N-th one, as in the Keras 3 wrapper.

What the Keras 3 wrapper has and this one refuses with a ValueError:
``compression_params`` (BytePS's compressors) and asynchronous training
(BYTEPS_ENABLE_ASYNC=1); ``compression=Compression.fp16`` works.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import tensorflow as tf

from byteps.tensorflow.gradients import GradientReducer
from byteps.tensorflow.keras.accumulation import BackwardPassAccumulator
from byteps.tensorflow.keras.optimizer_state import build_optimizer, optimizer_variables
from byteps.tensorflow.which_keras import keras

__all__ = ["Keras2DistributedOptimizer", "check_keras2_optimizer", "is_keras2_optimizer"]


def is_keras2_optimizer(optimizer: Any) -> bool:
    """Whether ``optimizer`` is one of Keras 2's (either family)."""
    return isinstance(optimizer, (keras.optimizers.Optimizer, keras.optimizers.legacy.Optimizer))


class Keras2DistributedOptimizer:
    """Mixin put in front of a Keras 2 optimizer class by :func:`~byteps.tensorflow.keras.DistributedOptimizer`."""

    _byteps_reducer: GradientReducer
    _byteps_passes: int
    _byteps_average_passes: bool
    _byteps_accumulator: Optional[BackwardPassAccumulator]

    def _byteps_configure(self, reducer: GradientReducer, backward_passes_per_step: int,
                          average_aggregated_gradients: bool) -> None:
        # object.__setattr__: kept out of Keras's tracking, so the optimizer's variables stay the original's.
        object.__setattr__(self, "_byteps_reducer", reducer)
        object.__setattr__(self, "_byteps_passes", backward_passes_per_step)
        object.__setattr__(self, "_byteps_average_passes", average_aggregated_gradients)
        object.__setattr__(self, "_byteps_accumulator", None)
        object.__setattr__(self, "_byteps_slots", {})
        object.__setattr__(self, "_byteps_local", set())  # refs of worker-local variables

    def register_local_var(self, var: Any) -> None:
        """Horovod's: ``var``'s gradient stays this worker's own (not sent)."""
        self._byteps_local.add(var.ref())

    def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        """Average the gradients over all workers (every ``backward_passes_per_step`` calls), then apply them."""
        pairs = list(grads_and_vars)
        grads = [g for g, _ in pairs]
        variables = [v for _, v in pairs]
        local = [v.ref() in self._byteps_local for v in variables] if self._byteps_local else None
        apply = super().apply_gradients  # type: ignore[misc]
        if self._byteps_passes == 1:
            return apply(list(zip(self._byteps_reducer.reduce(grads, local), variables)), *args, **kwargs)
        return self._byteps_accumulate(grads, variables, local, lambda reduced: apply(
            list(zip(reduced, variables)), *args, **kwargs))

    def _byteps_accumulate(self, grads: List[Any], variables: List[Any], local: Optional[Sequence[bool]],
                           apply: Callable[[List[Any]], Any]) -> tf.Tensor:
        """Add this pass's gradients locally; every N-th pass reduce the sums and apply them once."""
        if self._byteps_accumulator is None:
            # The optimizer's slots and the sums are made here, outside the tf.cond below: a variable cannot
            # be created in one of its branches.
            build_optimizer(self, variables)
            object.__setattr__(self, "_byteps_accumulator", BackwardPassAccumulator(variables, self._byteps_passes))
            object.__setattr__(self, "_byteps_slots", {v.ref(): i for i, v in enumerate(variables)})
        missing = [v.name for v in variables if v.ref() not in self._byteps_slots]
        if missing:
            raise ValueError(f"DistributedOptimizer first accumulated other variables than these: {missing}")
        slots = [self._byteps_slots[v.ref()] for v in variables]
        return self._byteps_accumulator.apply_every(grads, slots, self._byteps_average_passes,
                                                    lambda totals: apply(self._byteps_reducer.reduce(totals, local)))


def check_keras2_optimizer(optimizer: Any) -> None:
    """Refuse what cannot be wrapped: a LossScaleOptimizer, or an optimizer whose state exists already."""
    if isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer):
        raise NotImplementedError("wrap the inner optimizer, then build the LossScaleOptimizer around the result")
    built = getattr(optimizer, "_built", False) if isinstance(optimizer, keras.optimizers.Optimizer) \
        else bool(optimizer_variables(optimizer))
    if built:
        raise ValueError("the optimizer is already built and its state would be lost: wrap it before training")
