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
a subclass of its class. The gradients are averaged where Horovod's Keras
wrapper averages them, in ``compute_gradients``/``_compute_gradients``
(and ``get_gradients``), which ``minimize``, ``model.fit`` and
``train_on_batch`` go through; ``apply_gradients`` then applies them as
they are. ``apply_gradients`` called with gradients that did not come from
them (a custom loop with its own tape) averages them itself, where Horovod
would apply this worker's own gradients. ``compute_gradients`` and the
``apply_gradients`` that takes its result run in the same ``tf.function``
(or both eagerly), as ``minimize`` and ``model.fit`` do; otherwise
``apply_gradients`` raises a ValueError.

``backward_passes_per_step=N`` follows Horovod's helper as well: each pass
adds its gradients to local sums (``_agg_helper``, whose ``counter`` is
the passes since the last reduction) and returns the running sums; every
N-th pass the sums are averaged over the workers and applied. The other
passes apply nothing but add 1 to ``iterations``, so ``iterations``,
learning-rate schedules and Adam's bias correction count backward passes,
as with Horovod (the Keras 3 wrapper counts updates, as Keras 3's own
``gradient_accumulation_steps`` does for ``iterations``).

What the Keras 3 wrapper has and this one refuses with a ValueError:
``compression_params`` (BytePS's compressors) and asynchronous training
(BYTEPS_ENABLE_ASYNC=1); ``compression=Compression.fp16`` works.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import tensorflow as tf

from byteps.tensorflow.gradients import GradientReducer, last_round
from byteps.tensorflow.keras.accumulation import BackwardPassAccumulator
from byteps.tensorflow.keras.optimizer_state import build_optimizer, optimizer_variables
from byteps.tensorflow.skipped_rounds import apply_skipped_round
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
    _agg_helper: Optional[BackwardPassAccumulator]   # Horovod's name; made at the first pass when N > 1
    _byteps_reduced_in: Any

    def _byteps_configure(self, reducer: GradientReducer, backward_passes_per_step: int,
                          average_aggregated_gradients: bool) -> None:
        # object.__setattr__: kept out of Keras's tracking, so the optimizer's variables stay the original's.
        object.__setattr__(self, "_byteps_reducer", reducer)
        object.__setattr__(self, "_byteps_passes", backward_passes_per_step)
        object.__setattr__(self, "_byteps_average_passes", average_aggregated_gradients)
        object.__setattr__(self, "_agg_helper", None)
        object.__setattr__(self, "_byteps_slots", {})
        object.__setattr__(self, "_byteps_local", set())  # refs of worker-local variables
        # Between a compute_gradients that reduced and the apply_gradients that takes its result: where the
        # reduction was traced (_EAGER, or the graph of a tf.function); _NONE otherwise.
        object.__setattr__(self, "_byteps_reduced_in", _NONE)
        object.__setattr__(self, "_byteps_sent_for", None)  # the variables of the last averaged round

    def skip_step(self, session: Any = None) -> bool:
        """Backup workers: as the Keras 3 wrapper's ``skip_step()`` (the round's averages applied with this
        optimizer's own update, True), or False; not with ``backward_passes_per_step`` > 1. Eagerly, or with
        eager execution disabled in ``session`` (default: the default session), as
        :func:`byteps.tensorflow.skip_step`."""
        if self._byteps_passes != 1 or self._byteps_sent_for is None:
            return False
        return apply_skipped_round(last_round(self._byteps_reducer.prefix), self._byteps_sent_for,
                                   super().apply_gradients, self, session,  # type: ignore[misc]
                                   "DistributedOptimizer.skip_step()")

    def register_local_var(self, var: Any) -> None:
        """Horovod's: ``var``'s gradient stays this worker's own (not sent)."""
        self._byteps_local.add(var.ref())

    def compute_gradients(self, loss: Any, var_list: Any, tape: Any = None) -> List[Tuple[Any, Any]]:
        """The gradients averaged over all workers (with N > 1: see the module docstring)."""
        return self._compute_gradients(loss, var_list, None, tape)

    def _compute_gradients(self, loss: Any, var_list: Any, grad_loss: Any = None,
                           tape: Any = None) -> List[Tuple[Any, Any]]:
        base = super()
        if hasattr(base, "_compute_gradients"):   # the legacy family (OptimizerV2)
            pairs = base._compute_gradients(loss, var_list, grad_loss=grad_loss, tape=tape)  # type: ignore[misc]
        else:
            pairs = base.compute_gradients(loss, var_list, tape=tape)  # type: ignore[misc]
        variables = [v for _, v in pairs]
        reduced = self._byteps_reduce([g for g, _ in pairs], variables)
        object.__setattr__(self, "_byteps_reduced_in", _context())
        return list(zip(reduced, variables))

    def get_gradients(self, loss: Any, params: Any) -> List[Any]:
        """The legacy family's graph-mode entry point: its gradients, averaged over all workers."""
        reduced = self._byteps_reduce(super().get_gradients(loss, params), list(params))  # type: ignore[misc]
        object.__setattr__(self, "_byteps_reduced_in", _context())
        return reduced

    def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        """Apply the gradients of ``compute_gradients`` as they are, or average others first; with N > 1
        apply after every N-th pass only and count the other passes in ``iterations``."""
        pairs = list(grads_and_vars)
        variables = [v for _, v in pairs]
        grads = [g for g, _ in pairs]
        reduced_in = self._byteps_reduced_in
        object.__setattr__(self, "_byteps_reduced_in", _NONE)
        if reduced_in is _NONE:
            grads = self._byteps_reduce(grads, variables)
        elif not _inside(_context(), reduced_in):
            # The reduction ran once, while a tf.function was traced; later calls run the graph without
            # Python, so whether these gradients are averaged cannot be told here: refuse rather than guess.
            raise ValueError("compute_gradients and apply_gradients of a byteps DistributedOptimizer must run "
                             "in the same tf.function, or both eagerly: call both in one function, or use "
                             "minimize()")
        apply = super().apply_gradients  # type: ignore[misc]
        if self._byteps_passes == 1:
            return apply(list(zip(grads, variables)), *args, **kwargs)
        return self._agg_helper.apply_when_due(lambda: apply(list(zip(grads, variables)), *args, **kwargs),
                                               self.iterations, after=grads)

    def _byteps_reduce(self, grads: List[Any], variables: List[Any]) -> List[Any]:
        """Averaged over the workers; with N > 1 added to the local sums, which are averaged every N-th pass."""
        local = [v.ref() in self._byteps_local for v in variables] if self._byteps_local else None
        if self._byteps_passes == 1:
            object.__setattr__(self, "_byteps_sent_for", list(variables))
            return self._byteps_reducer.reduce(grads, local)
        if self._agg_helper is None:
            # The optimizer's slots and the sums are made here, outside the tf.cond that applies: a variable
            # cannot be created in one of its branches.
            build_optimizer(self, variables)
            object.__setattr__(self, "_agg_helper", BackwardPassAccumulator(variables, self._byteps_passes))
            object.__setattr__(self, "_byteps_slots", {v.ref(): i for i, v in enumerate(variables)})
        missing = [v.name for v in variables if v.ref() not in self._byteps_slots]
        if missing:
            raise ValueError(f"DistributedOptimizer first accumulated other variables than these: {missing}")
        slots = [self._byteps_slots[v.ref()] for v in variables]
        return self._agg_helper.reduce_every(grads, slots, self._byteps_average_passes,
                                             lambda totals: self._byteps_reducer.reduce(totals, local))


_NONE = object()
_EAGER = object()


def _context() -> Any:
    """Where TensorFlow runs the ops being made now: eagerly, or into the graph being traced."""
    return _EAGER if tf.executing_eagerly() else tf.compat.v1.get_default_graph()


def _inside(here: Any, there: Any) -> bool:
    """Whether ops made ``here`` run within ``there``: the same place, or a branch or body graph nested in it
    (a ``LossScaleOptimizer`` applies inside a ``tf.cond``)."""
    while here is not there:
        here = getattr(here, "outer_graph", None)
        if here is None:
            return False
    return True


def check_keras2_optimizer(optimizer: Any) -> None:
    """Refuse what cannot be wrapped: a LossScaleOptimizer, or an optimizer whose state exists already."""
    if isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer):
        raise NotImplementedError("wrap the inner optimizer, then build the LossScaleOptimizer around the result")
    built = getattr(optimizer, "_built", False) if isinstance(optimizer, keras.optimizers.Optimizer) \
        else bool(optimizer_variables(optimizer))
    if built:
        raise ValueError("the optimizer is already built and its state would be lost: wrap it before training")
