"""DistributedOptimizer for TensorFlow: Keras optimizers and TF1 ``tf.compat.v1.train.Optimizer``.

Example::

    opt = bps.DistributedOptimizer(keras.optimizers.SGD(0.01 * bps.size()))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")

    opt = bps.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    opt.minimize(loss_fn, var_list=variables)        # eager or in a TF1 graph

A Keras optimizer is handed to :func:`byteps.tensorflow.keras.DistributedOptimizer`
(which averages in ``apply``); a TF1 optimizer is wrapped so that
``compute_gradients`` averages, as in Horovod.

With BYTEPS_ENABLE_ASYNC=1 a TF1 optimizer trains BytePS's asynchronous way
instead: ``compute_gradients`` returns this worker's own gradients and
``apply_gradients`` applies them, then pushes the change of the variables
it was given (those without a gradient too, with a zero change) and assigns
the servers' values (:mod:`byteps.tensorflow.async_training`), eagerly, in
``tf.function`` or in a TF1 graph (where its op does all of it). Pass the
same variable list every step (or lists with no variable in common).
"""

from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf

from byteps.common.frontend import check_passes
from byteps.common.frontend.reductions import Adasum, Average
from byteps.tensorflow.adasum_optimizer import DistributedAdasumV1Optimizer
from byteps.tensorflow.async_training import ExchangesByList, asynchronous
from byteps.tensorflow.compression import Compression
from byteps.tensorflow.gradient_compression import take_compression_params
from byteps.tensorflow.gradients import GradientReducer, last_round
from byteps.tensorflow.keras.accumulation import BackwardPassAccumulator
from byteps.tensorflow.ops import check_process_set
from byteps.tensorflow.skipped_rounds import apply_skipped_round

__all__ = ["DistributedOptimizer"]


class _DistributedV1Optimizer(tf.compat.v1.train.Optimizer):
    """A TF1 optimizer whose compute_gradients() averages over all workers; the rest is delegated."""

    def __init__(self, optimizer: tf.compat.v1.train.Optimizer, name: Optional[str], use_locking: bool,
                 reducer: GradientReducer, async_prefix: Optional[str] = None, backward_passes_per_step: int = 1,
                 average_aggregated_gradients: bool = False) -> None:
        self._optimizer = optimizer
        self._reducer = reducer
        self._passes = backward_passes_per_step
        self._average_passes = average_aggregated_gradients
        self._accumulator: Optional[BackwardPassAccumulator] = None  # made at the first pass when N > 1
        self._slots: Dict[Any, int] = {}  # a variable's ref: its sum's position in the accumulator
        # Asynchronous training: one exchange per list of variables applied to, numbered in order of first use.
        self._async_prefix = async_prefix
        self._exchanges = None if async_prefix is None else ExchangesByList(async_prefix, "DistributedOptimizer")
        self._sent_for: Optional[List[Any]] = None  # the variables of the last averaged round (backup workers)
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}", use_locking=use_locking)

    def compute_gradients(self, *args: Any, **kwargs: Any) -> List[Tuple[Any, Any]]:
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        if not pairs or self._async_prefix is not None:
            return pairs
        gradients = [gradient for gradient, _ in pairs]
        variables = [variable for _, variable in pairs]
        if self._passes == 1:
            gradients = self._reducer.reduce(gradients)
            self._sent_for = variables
        else:
            gradients = self._accumulate(gradients, variables)
        return list(zip(gradients, variables))

    def _accumulate(self, gradients: List[Any], variables: List[Any]) -> List[Any]:
        """Horovod's order: add to the local sums; every N-th pass reduce them (and zero them), else return
        the running sums, which :meth:`apply_gradients` does not apply."""
        if self._accumulator is None:
            self._accumulator = BackwardPassAccumulator(variables, self._passes)
            self._slots = {variable.ref(): i for i, variable in enumerate(variables)}
        missing = [variable.name for variable in variables if variable.ref() not in self._slots]
        if missing:
            raise ValueError(f"DistributedOptimizer(backward_passes_per_step={self._passes}) accumulates the "
                             f"variables of its first compute_gradients call; these are new: {missing}")
        slots = [self._slots[variable.ref()] for variable in variables]
        return self._accumulator.reduce_every(gradients, slots, self._average_passes, self._reducer.reduce)

    def apply_gradients(self, grads_and_vars: Any, global_step: Any = None, name: Optional[str] = None) -> Any:
        """The wrapped optimizer's; with ``backward_passes_per_step=N`` only after a pass that reduced (the
        others add 1 to ``global_step``, so that it counts passes, as Horovod's)."""
        if self._async_prefix is None and self._accumulator is not None:
            pairs = list(grads_and_vars)
            applied = self._accumulator.apply_when_due(
                lambda: self._optimizer.apply_gradients(pairs, global_step=global_step, name=name), global_step,
                after=[gradient for gradient, _ in pairs])
            return applied if tf.executing_eagerly() else applied.op
        if self._async_prefix is None:
            return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
        pairs = list(grads_and_vars)
        if all(gradient is None for gradient, _ in pairs):
            # TF1's error for no gradients
            return self._optimizer.apply_gradients(pairs, global_step=global_step, name=name)
        # Every variable of the list, those without a gradient too (a zero delta): the same list, and the same
        # servers' keys, every step.
        exchange = self._exchanges.get([variable for _, variable in pairs])
        return exchange.around(lambda: self._optimizer.apply_gradients(pairs, global_step=global_step, name=name))

    def skip_step(self, session: Any = None, global_step: Any = None) -> bool:
        """Backup workers (BYTEPS_BACKUP_WORKERS=b, docs/async.md): step without computing when behind.

        When the servers' answers to the last ``compute_gradients`` round said
        that the next round already closed without this worker, this pulls
        that round's averages (nothing pushed), applies them with the wrapped
        optimizer (``global_step`` as in your ``apply_gradients``) and returns
        True: skip this batch. Otherwise False, nothing done; also with
        ``backward_passes_per_step`` > 1, asynchronous training and rounds that
        cannot close early (see :func:`byteps.tensorflow.skip_step`). Call it
        before the step, eagerly, or in a TF1 graph with the ``session`` that
        runs the training op (default: the default session)::

            for feed in batches:
                if opt.skip_step(session, global_step=step):
                    continue
                session.run(train_op, feed)
        """
        if self._passes != 1 or self._async_prefix is not None or self._sent_for is None:
            return False

        def apply(pairs: List[Tuple[Any, Any]]) -> Any:
            return self._optimizer.apply_gradients(pairs, global_step=global_step)

        return apply_skipped_round(last_round(self._reducer.prefix), self._sent_for, apply, self, session,
                                   "DistributedOptimizer.skip_step()")

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.variables(*args, **kwargs)


def _is_keras_optimizer(optimizer: Any) -> bool:
    """A Keras 3 optimizer, or one of Keras 2's (tf_keras: its optimizers and its legacy ones)."""
    keras, keras2 = sys.modules.get("keras"), sys.modules.get("tf_keras")
    if keras is not None and isinstance(optimizer, keras.optimizers.Optimizer):
        return True
    return keras2 is not None and isinstance(optimizer, (keras2.optimizers.Optimizer,
                                                         keras2.optimizers.legacy.Optimizer))


def DistributedOptimizer(optimizer: Any, name: Optional[str] = None, use_locking: bool = False,
                         device_dense: str = "", device_sparse: str = "", compression: Any = Compression.none,
                         sparse_as_dense: bool = False, backward_passes_per_step: int = 1, op: int = Average,
                         gradient_predivide_factor: float = 1.0, average_aggregated_gradients: bool = False,
                         num_groups: int = 0, groups: Any = None, process_set: Any = None,
                         scale_local_gradients: bool = True,
                         compression_params: Optional[Dict[str, Any]] = None) -> Any:
    """Wrap ``optimizer`` so that its updates use gradients averaged over all workers (Horovod's signature).

    Keras 3 optimizers support every argument, Keras 2's (with
    TF_USE_LEGACY_KERAS=1) all but the compression and asynchronous ones (see
    :func:`byteps.tensorflow.keras.DistributedOptimizer`); TF1 optimizers
    all but local variables. Device and group arguments are accepted and
    ignored.

    ``backward_passes_per_step=N`` with a TF1 optimizer follows Horovod's:
    ``compute_gradients`` adds each pass's gradients to local sums (not
    optimizer variables: they are neither in ``get_slot`` nor the
    optimizer's ``variables()``) and every N-th pass returns them reduced
    over the workers (divided by N if ``average_aggregated_gradients``),
    the other passes the running sums; ``apply_gradients`` applies only
    after a pass that reduced, and on the others adds 1 to ``global_step``
    (if given), which thus counts passes, as with Horovod. Eagerly, in
    ``tf.function`` and in a TF1 graph.

    ``process_set`` averages over that set's ranks only; a rank outside the
    set applies its own gradients, as Horovod's wrappers do (see
    :mod:`byteps.tensorflow.gradients`).

    ``op=Adasum``: with a TF1 optimizer, Horovod's delta optimizer (each
    worker steps locally; every ``backward_passes_per_step``-th step the
    variables' changes are combined by Adasum:
    :mod:`byteps.tensorflow.adasum_optimizer`); with a Keras optimizer the
    gradients are combined by Adasum, as ``byteps.tensorflow.keras``'s
    wrapper does (Horovod's ``horovod.tensorflow.DistributedOptimizer``
    refuses Keras with Adasum, its Keras module does this).

    ``compression_params`` is BytePS's gradient compression, the dict of
    docs/compression.md, e.g. ``{"compressor": "onebit", "scaling": True,
    "ef": "vanilla", "momentum": "nesterov"}``: gradients of at least
    BYTEPS_MIN_COMPRESS_BYTES are compressed on their way to the servers
    (each compressed alone) with the optimizer's learning rate;
    ``"nesterov"`` takes the optimizer's momentum (a TF1
    ``MomentumOptimizer``'s, or a Keras optimizer's ``momentum``) and sets
    the optimizer's own to 0, as BytePS does.

    With BYTEPS_ENABLE_ASYNC=1 both kinds train asynchronously (see the
    module docstring); compression and process sets are refused there.
    """
    async_mode = asynchronous("DistributedOptimizer", compression, compression_params, process_set)
    check_process_set(process_set)
    if _is_keras_optimizer(optimizer):
        from byteps.tensorflow.keras.optimizer import DistributedOptimizer as keras_distributed_optimizer

        return keras_distributed_optimizer(
            optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
            gradient_predivide_factor=gradient_predivide_factor, op=op,
            backward_passes_per_step=backward_passes_per_step,
            average_aggregated_gradients=average_aggregated_gradients, scale_local_gradients=scale_local_gradients,
            compression_params=compression_params, process_set=process_set)
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        check_passes(backward_passes_per_step)
        if async_mode and backward_passes_per_step != 1:
            raise ValueError("BYTEPS_ENABLE_ASYNC=1 with a TF1 optimizer exchanges every pass: use "
                             "backward_passes_per_step=1, or a Keras optimizer")
        prefix = f"DistributedOptimizer.{name or type(optimizer).__name__}"
        compression, compressed = take_compression_params(compression_params, optimizer, compression, prefix,
                                                          "DistributedOptimizer")
        reducer = GradientReducer(prefix, compression, sparse_as_dense, op, gradient_predivide_factor, compressed,
                                  process_set=process_set)
        if op == Adasum and not async_mode:
            if average_aggregated_gradients:
                raise ValueError("op=Adasum takes backward_passes_per_step local steps between combinations, "
                                 "it does not aggregate gradients: drop average_aggregated_gradients (as Horovod)")
            return DistributedAdasumV1Optimizer(optimizer, name, use_locking, reducer, backward_passes_per_step)
        return _DistributedV1Optimizer(optimizer, name, use_locking, reducer, prefix if async_mode else None,
                                       backward_passes_per_step, average_aggregated_gradients)
    raise TypeError(f"DistributedOptimizer wraps a Keras 3 optimizer or a tf.compat.v1.train.Optimizer, "
                    f"got {type(optimizer).__module__}.{type(optimizer).__name__}")
