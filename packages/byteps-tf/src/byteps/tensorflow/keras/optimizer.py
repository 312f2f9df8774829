"""DistributedOptimizer for Keras optimizers (TensorFlow backend); Keras 2's in :mod:`.keras2_optimizer`.

Example::

    opt = bps.DistributedOptimizer(keras.optimizers.Adam(0.001 * bps.size()))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    model.fit(x, y, callbacks=[bps.callbacks.BroadcastGlobalVariablesCallback(0)])

The result is a new optimizer of a subclass of the given one's class (built
from its config, as Horovod does), so ``isinstance`` checks, learning-rate
setters and schedules keep working. It averages the gradients in
``apply()``, which ``apply_gradients()``, ``minimize()`` and ``model.fit``
all go through, before clipping, loss-scale unscaling and the update.

With BYTEPS_ENABLE_ASYNC=1 (on every process) the same call gives BytePS's
asynchronous training instead: ``apply()`` applies this worker's own
gradients (not averaged), then pushes the change of every variable the
optimizer was built for and takes the servers' values
(:mod:`byteps.tensorflow.async_training`, docs/async.md). Eagerly or inside
``model.fit``'s ``tf.function`` alike; no script change.

Saving: the subclass reports the original class and module, so a model
saved with it loads as the plain optimizer anywhere, and as a distributed
one through :func:`byteps.tensorflow.keras.load_model`.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from byteps.common.frontend import check_passes
from byteps.common.frontend.reductions import Average
from byteps.tensorflow.async_training import VariableExchange, asynchronous
from byteps.tensorflow.compression import Compression
from byteps.tensorflow.gradient_compression import take_compression_params
from byteps.tensorflow.gradients import GradientReducer
from byteps.tensorflow.keras.accumulation import BackwardPassAccumulator
from byteps.tensorflow.keras.keras2_optimizer import (
    Keras2DistributedOptimizer,
    check_keras2_optimizer,
    is_keras2_optimizer,
)
from byteps.tensorflow.ops import check_process_set
from byteps.tensorflow.which_keras import KERAS2, keras

__all__ = ["DistributedOptimizer", "PartialDistributedOptimizer", "distributed_class"]

_classes: Dict[type, type] = {}


class _DistributedOptimizer:
    """Mixin put in front of a Keras optimizer class; see :func:`DistributedOptimizer`."""

    _byteps_reducer: GradientReducer
    _byteps_passes: int
    _byteps_average_passes: bool
    _byteps_accumulator: Optional[BackwardPassAccumulator]
    _byteps_slots: Dict[Any, int]
    _byteps_async_prefix: Optional[str]
    _byteps_exchange: Optional[VariableExchange]

    def _byteps_configure(self, reducer: GradientReducer, backward_passes_per_step: int,
                          average_aggregated_gradients: bool, async_prefix: Optional[str] = None) -> None:
        # object.__setattr__: plain bookkeeping, kept out of Keras' (and TensorFlow's) attribute tracking, so
        # that the optimizer's variables, saved and broadcast, stay those of the optimizer it copies.
        object.__setattr__(self, "_byteps_reducer", reducer)
        object.__setattr__(self, "_byteps_passes", backward_passes_per_step)
        object.__setattr__(self, "_byteps_average_passes", average_aggregated_gradients)
        object.__setattr__(self, "_byteps_accumulator", None)
        object.__setattr__(self, "_byteps_slots", {})
        object.__setattr__(self, "_byteps_async_prefix", async_prefix)  # None: synchronous training
        object.__setattr__(self, "_byteps_exchange", None)
        object.__setattr__(self, "_byteps_local", set())  # _var_key of worker-local variables
        object.__setattr__(self, "_byteps_sent_for", None)  # the variables of the last averaged round

    def register_local_var(self, var: Any) -> None:
        """Horovod's: ``var``'s gradient stays this worker's own (not sent; divided by ``size()`` unless
        the optimizer was made with ``scale_local_gradients=False``)."""
        if self._byteps_async_prefix is not None:
            raise ValueError("local variables are not supported with asynchronous training (BYTEPS_ENABLE_ASYNC=1)")
        self._byteps_local.add(self._var_key(var))

    def build(self, variables: List[Any]) -> None:
        # Keras' optimizers ignore a second build (their slots stay); so do the accumulators.
        first = not self.built
        super().build(variables)
        if self._byteps_async_prefix is not None and first:
            object.__setattr__(self, "_byteps_exchange",
                               VariableExchange(self._byteps_async_prefix, self._trainable_variables,
                                                "DistributedOptimizer"))
        if self._byteps_passes > 1 and first:
            object.__setattr__(self, "_byteps_accumulator", BackwardPassAccumulator(variables, self._byteps_passes))
            object.__setattr__(self, "_byteps_slots", {self._var_key(v): i for i, v in enumerate(variables)})

    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        """Average ``grads`` over all workers (every ``backward_passes_per_step`` calls), then apply them.

        Asynchronous training: apply them as they are, then exchange the change.
        """
        grads = list(grads)
        if trainable_variables is not None:
            trainable_variables = list(trainable_variables)
            if not self.built:
                self.build(trainable_variables)
        if self._byteps_passes == 1:
            return self._byteps_update(grads, trainable_variables)
        variables = trainable_variables if trainable_variables is not None else self._trainable_variables
        return self._byteps_accumulate(grads, variables, trainable_variables)

    def _byteps_update(self, grads: List[Any], given: Optional[List[Any]]) -> None:
        """One update: synchronous, the averaged gradients; asynchronous, the local ones and the exchange."""
        apply = super().apply
        exchange = self._byteps_exchange
        if exchange is None:
            object.__setattr__(self, "_byteps_sent_for", given if given is not None else self._trainable_variables)
        if exchange is None or not grads:
            apply(self._byteps_reducer.reduce(grads, self._byteps_local_mask(given)) if exchange is None
                  else grads, given)
            return
        # Every variable the optimizer was built for goes (unchanged ones with a zero delta): the same names
        # on every rank whichever subset a call updates.
        exchange.around(lambda: apply(grads, given))

    def skip_step(self) -> bool:
        """Backup workers (BYTEPS_BACKUP_WORKERS=b, docs/async.md): step without computing when behind.

        When the servers' answers to the last update said that the next round
        already closed without this worker, this pulls that round's averaged
        gradients (nothing pushed), applies them (an eager update, the same
        one the others applied) and returns True: skip this batch's forward
        and backward pass. Otherwise (in time, no backup workers, one worker,
        ``backward_passes_per_step`` > 1, asynchronous training, or a round that
        cannot close early: see :func:`byteps.tensorflow.skip_step`) it returns
        False: compute the step as usual. Call it eagerly, before the step::

            for x, y in dataset:
                if opt.skip_step():
                    continue
                train_step(x, y)        # a tf.function: tape, opt.apply_gradients(...)

        In ``model.fit`` use :class:`byteps.tensorflow.keras.callbacks.SkipStepCallback`.
        """
        if self._byteps_passes != 1 or self._byteps_exchange is not None or self._byteps_sent_for is None:
            return False
        averaged = self._byteps_reducer.skip_round()
        if averaged is None:
            return False
        pairs = [(g, v) for g, v in zip(averaged, self._byteps_sent_for) if g is not None]
        if pairs:
            super().apply([g for g, _ in pairs], [v for _, v in pairs])
        return True

    def _byteps_local_mask(self, given: Optional[List[Any]]) -> Optional[List[bool]]:
        if not self._byteps_local:
            return None
        variables = given if given is not None else self._trainable_variables
        return [self._var_key(v) in self._byteps_local for v in variables]

    def _byteps_accumulate(self, grads: List[Any], variables: List[Any], given: Optional[List[Any]]) -> None:
        """Add this pass's gradients locally; every N-th pass reduce the sums and apply them once.

        The passes in between change neither the model nor the optimizer's
        variables (``iterations`` included), so slots, Adam's bias
        correction and learning-rate schedules advance once per update.
        """
        missing = [getattr(v, "path", v.name) for v in variables if self._var_key(v) not in self._byteps_slots]
        if missing:
            raise ValueError(f"DistributedOptimizer was built without these variables: {missing}")
        slots = [self._byteps_slots[self._var_key(v)] for v in variables]
        self._byteps_accumulator.apply_every(grads, slots, self._byteps_average_passes,
                                             lambda totals: self._byteps_update(totals, given))


def distributed_class(base: type) -> type:
    """The distributed subclass of a Keras optimizer class (one per class), named and placed like it."""
    cls = _classes.get(base)
    if cls is None:
        mixin = Keras2DistributedOptimizer if KERAS2 else _DistributedOptimizer
        cls = _classes[base] = type(base.__name__, (mixin, base),
                                    {"__module__": base.__module__, "__qualname__": base.__qualname__})
    return cls


def DistributedOptimizer(optimizer: Any, name: Optional[str] = None,
                         device_dense: str = "", device_sparse: str = "", compression: Any = Compression.none,
                         sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0, op: int = Average,
                         backward_passes_per_step: int = 1, average_aggregated_gradients: bool = False,
                         num_groups: int = 0, groups: Any = None, process_set: Any = None,
                         scale_local_gradients: bool = True,
                         compression_params: Optional[Dict[str, Any]] = None) -> Any:
    """A copy of ``optimizer`` (from its config) whose updates use gradients averaged over all workers.

    Horovod's signature. ``backward_passes_per_step=N`` sums N passes'
    gradients locally (divided by N if ``average_aggregated_gradients``;
    Horovod's default is the sum) and, every N-th pass, averages them over
    the workers and applies them once; the other passes apply nothing and
    leave ``iterations`` alone. The sums are not optimizer variables: the
    optimizer saves, loads and broadcasts exactly the state of the one it
    copies. ``compression``, ``sparse_as_dense``, ``op`` and
    ``gradient_predivide_factor`` are as in
    :func:`byteps.tensorflow.DistributedGradientTape`: with ``op=Adasum``
    the gradients are combined by Adasum (as Horovod's Keras wrapper does;
    with N > 1, the passes' sums); ``name`` names the
    byteps tensors (default: the optimizer's name). Device and group
    arguments are accepted and ignored. ``register_local_var(var)`` keeps
    ``var``'s gradient local (not sent), divided by ``size()`` when
    ``scale_local_gradients`` (Horovod's default); see
    :func:`PartialDistributedOptimizer`.

    ``compression_params`` is BytePS's gradient compression, the dict of
    docs/compression.md, e.g. ``{"compressor": "onebit", "scaling": True,
    "ef": "vanilla", "momentum": "nesterov"}``: gradients of at least
    BYTEPS_MIN_COMPRESS_BYTES are compressed on their way to the servers
    (each compressed alone), with ``learning_rate`` at the current
    iteration (schedules included) for error feedback. ``"nesterov"``
    takes the optimizer's ``momentum`` and sets the copy's ``momentum`` to
    0.0 before it builds its variables (so its config, and a model saved
    with it, say 0.0): byteps applies the momentum instead, as BytePS does.

    Wrap the optimizer before it is built (before ``fit`` or the first
    ``apply``): its state is not copied. ``jit_compile`` must stay False
    (XLA cannot compile byteps' ``tf.py_function``).

    With BYTEPS_ENABLE_ASYNC=1 the updates are BytePS's asynchronous ones
    (see the module docstring): each worker applies its own gradients (so
    do not scale the learning rate by ``size()``) and exchanges the change
    with the servers; ``compression``/``compression_params`` and process
    sets are refused (ValueError), the reduction arguments do not apply.
    ``backward_passes_per_step=N`` applies and exchanges every N-th pass.
    """
    async_mode = asynchronous("DistributedOptimizer", compression, compression_params, process_set)
    check_process_set(process_set)
    if hasattr(optimizer, "_byteps_reducer"):
        raise ValueError("this optimizer is already a DistributedOptimizer; wrap the original optimizer once")
    check_passes(backward_passes_per_step)
    prefix = f"DistributedOptimizer.{name or getattr(optimizer, 'name', None) or type(optimizer).__name__}"
    if KERAS2:
        if not is_keras2_optimizer(optimizer):
            raise TypeError(f"DistributedOptimizer wraps a Keras 2 optimizer (TF_USE_LEGACY_KERAS=1), got "
                            f"{type(optimizer).__module__}.{type(optimizer).__name__}")
        if async_mode or compression_params:
            raise ValueError("with Keras 2 (TF_USE_LEGACY_KERAS=1) DistributedOptimizer averages gradients "
                             "only: compression_params and BYTEPS_ENABLE_ASYNC=1 need Keras 3")
        check_keras2_optimizer(optimizer)
        wrapped = distributed_class(type(optimizer)).from_config(optimizer.get_config())
        wrapped._byteps_configure(GradientReducer(prefix, compression, sparse_as_dense, op, gradient_predivide_factor,
                                                  None, scale_local_gradients, process_set),
                                  backward_passes_per_step, average_aggregated_gradients)
        return wrapped
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a Keras optimizer, got {type(optimizer).__name__}")
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise NotImplementedError("wrap the inner optimizer, then build the LossScaleOptimizer around the result")
    if optimizer.built:
        raise ValueError("the optimizer is already built and its state would be lost: wrap it before training, "
                         "or load a saved model with byteps.tensorflow.keras.load_model")
    wrapped = distributed_class(type(optimizer)).from_config(optimizer.get_config())
    compression, compressed = take_compression_params(compression_params, wrapped, compression, prefix,
                                                      "DistributedOptimizer")
    reducer = GradientReducer(prefix, compression, sparse_as_dense, op, gradient_predivide_factor, compressed,
                              scale_local_gradients, process_set)
    wrapped._byteps_configure(reducer, backward_passes_per_step, average_aggregated_gradients,
                              prefix if async_mode else None)
    return wrapped


def PartialDistributedOptimizer(optimizer: Any, name: Optional[str] = None,
                                device_dense: str = "", device_sparse: str = "", compression: Any = Compression.none,
                                sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                                op: int = Average, groups: Any = None, process_set: Any = None,
                                local_layers: Any = None, scale_local_gradients: bool = True,
                                **kwargs: Any) -> Any:
    """Horovod's: a :func:`DistributedOptimizer` whose ``local_layers``' gradients stay on each worker
    (not sent; divided by ``size()`` when ``scale_local_gradients``). Other keyword arguments are
    :func:`DistributedOptimizer`'s."""
    from byteps.tensorflow.gradient_tape import local_layer_variables
    local = local_layer_variables(local_layers)
    wrapped = DistributedOptimizer(optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
                                   gradient_predivide_factor, op, groups=groups, process_set=process_set,
                                   scale_local_gradients=scale_local_gradients, **kwargs)
    for variable in local:
        wrapped.register_local_var(variable)
    return wrapped
