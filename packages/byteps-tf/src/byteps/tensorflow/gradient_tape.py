"""DistributedGradientTape: a tf.GradientTape whose gradient() averages over all workers.

Example (eager or inside ``tf.function``)::

    with tf.GradientTape() as tape:
        loss = loss_fn(model(x), y)
    tape = bps.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)   # averaged over workers
    optimizer.apply_gradients(zip(grads, model.trainable_variables))

The wrapper is an instance of a subclass of the tape's own class that shares
the tape's recording, so it may wrap a tape before or after recording
(``with bps.DistributedGradientTape(tf.GradientTape()) as tape:`` works too).
Only ``gradient()`` communicates; ``jacobian`` and the rest are the tape's own.

BytePS's gradient compression (docs/compression.md) takes the optimizer
that applies the gradients, for its learning rate and momentum::

    tape = bps.DistributedGradientTape(tape, optimizer=optimizer,
                                       compression_params={"compressor": "topk", "k": 0.01, "ef": "vanilla"})

Asynchronous training (BYTEPS_ENABLE_ASYNC=1 on every process; docs/async.md)
--------------------------------------------------------------------------------
The same script trains asynchronously, BytePS's way: each worker applies its
own gradients and the servers add every worker's change to their
parameters. The tape does not own the update - the user's optimizer applies
the gradients after ``gradient()`` returns - so the exchange moves to the
next ``gradient()`` call, which

1. returns this worker's own gradients, not averaged, computed on the
   values the forward pass read;
2. pushes, for each variable among the sources, its value now minus the
   value the previous call left in it (the update applied in between: the
   previous step's), and assigns the servers' values, the ones the
   optimizer then updates.

The first call broadcasts rank 0's values into the servers' store and into
every rank's variables (its gradients were computed before that, on each
rank's own values; the update is applied to rank 0's). Each update thus reaches the servers one call late;
each forward pass runs on the servers' parameters of the previous exchange
plus this worker's last update. The last update of a loop stays local until
:func:`byteps.tensorflow.async_training.push_tape_updates` (or the next
``gradient()`` call). State lives per list of source variables, not per
tape, so a tape wrapped anew every step (the usual pattern) continues the
previous one's exchange; a second ``gradient()`` call with no update in
between pushes a zero change. Pass the same sources every step (or lists
with no variable in common), and a plain optimizer: a variable that a
DistributedOptimizer exchanges too is refused (ValueError), as its updates
would count twice. In a graph (``tf.function``) the exchange is
one ``tf.py_function`` op and the returned gradients wait for its assigns,
so the optimizer updates the servers' values. Sources that are tensors, not
variables, are not exchanged. Compression and process sets are refused
there (ValueError).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf

from byteps.common.frontend.reductions import Average
from byteps.tensorflow.async_training import asynchronous, is_variable, tape_exchange
from byteps.tensorflow.compression import Compression
from byteps.tensorflow.gradient_compression import take_compression_params
from byteps.tensorflow.gradients import GradientReducer, last_round
from byteps.tensorflow.ops import check_process_set
from byteps.tensorflow.skipped_rounds import apply_skipped_round

__all__ = ["DistributedGradientTape", "PartialDistributedGradientTape", "local_layer_variables", "skip_step"]

_classes: Dict[type, type] = {}


def source_key(source: Any) -> Any:
    """How a variable (or watched tensor) is recognised among a call's sources."""
    ref = getattr(source, "ref", None)
    return ref() if callable(ref) else id(source)


class _DistributedGradientTape(tf.GradientTape):
    _byteps_reducer: GradientReducer
    _byteps_async: bool
    _byteps_local: Dict[Any, Any]

    def register_local_source(self, source: Any) -> None:
        """Horovod's: ``source``'s gradient stays this worker's own (not sent; divided by ``size()``
        unless the tape was made with ``scale_local_gradients=False``)."""
        if self._byteps_async:
            raise ValueError("local sources are not supported with asynchronous training (BYTEPS_ENABLE_ASYNC=1)")
        self._byteps_local[source_key(source)] = source

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: Any = tf.UnconnectedGradients.NONE) -> Any:
        """The tape's gradients, averaged (or summed) over all workers; same structure as ``sources``.

        Asynchronous training: this worker's own gradients, after the
        exchange of the previous update (see the module docstring).
        """
        gradients = super().gradient(target, sources, output_gradients, unconnected_gradients)
        flat = tf.nest.flatten(gradients)
        if self._byteps_async:
            return tf.nest.pack_sequence_as(gradients, _after_exchange(flat, sources))
        local = None
        if self._byteps_local:
            local = [source_key(source) in self._byteps_local for source in tf.nest.flatten(sources)]
        return tf.nest.pack_sequence_as(gradients, self._byteps_reducer.reduce(flat, local))

    def get_local_and_global_gradients(self, target: Any, sources: Any,
                                       output_gradients: Any = None) -> Tuple[List[Any], List[Any]]:
        """Horovod's: :meth:`gradient` of a flat list of ``sources``, split into ``(source, gradient)`` pairs
        of the local sources (registered with :meth:`register_local_source`) and of the others."""
        local: List[Any] = []
        shared: List[Any] = []
        for source, gradient in zip(sources, self.gradient(target, list(sources), output_gradients)):
            (local if source_key(source) in self._byteps_local else shared).append((source, gradient))
        return local, shared


def _after_exchange(gradients: List[Any], sources: Any) -> List[Any]:
    """Exchange the source variables' last update; in a graph the gradients wait for its assigns."""
    variables = [source for source in tf.nest.flatten(sources) if is_variable(source)]
    if not variables:
        return gradients
    done = tape_exchange(variables).since_last()
    if done is None:
        return gradients
    with tf.control_dependencies([done]):
        return [_identity(gradient) for gradient in gradients]


def _identity(gradient: Any) -> Any:
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(tf.identity(gradient.values), tf.identity(gradient.indices), gradient.dense_shape)
    return tf.identity(gradient)


def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "", device_sparse: str = "",
                            compression: Any = Compression.none, sparse_as_dense: bool = False,
                            op: int = Average, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                            groups: Any = None, process_set: Any = None,
                            scale_local_gradients: bool = True, compression_params: Optional[Dict[str, Any]] = None,
                            optimizer: Any = None) -> tf.GradientTape:
    """Wrap ``gradtape`` so that ``gradient()`` returns gradients averaged over all workers.

    Horovod's signature. ``compression=Compression.fp16`` sends float16;
    ``sparse_as_dense=True`` densifies ``tf.IndexedSlices`` gradients, which
    otherwise take a row-sparse push_pull through the servers where the job
    allows it, else are gathered from every rank (see
    :mod:`byteps.tensorflow.gradients`, docs/sparse.md); ``op`` is
    ``Average``, ``Sum`` or ``Adasum`` (Horovod's: each gradient combined by Adasum over the
    ranks, a power-of-two number of them; ``tf.IndexedSlices`` need
    ``sparse_as_dense=True``; not with ``gradient_predivide_factor`` or
    ``compression_params``)::

        tape = bps.DistributedGradientTape(tape, op=bps.Adasum)
    All gradients of one ``gradient()`` call travel as one group (byteps
    pipelines them), so ``num_groups``/``groups`` are accepted and ignored,
    as are the device arguments. ``tape.register_local_source(var)`` keeps
    ``var``'s gradient local (not sent), divided by ``size()`` when
    ``scale_local_gradients`` (Horovod's default).

    ``process_set`` (a registered :class:`ProcessSet`) averages over its
    ranks only; on a rank outside it ``gradient()`` returns that rank's own
    gradients, as Horovod's does. Every rank of the set makes the same
    calls; the ranks outside may skip them::

        evens = bps.add_process_set([0, 2])
        tape = bps.DistributedGradientTape(tape, process_set=evens)

    ``compression_params`` is BytePS's gradient compression (the dict of
    docs/compression.md, as on ``DistributedOptimizer``): gradients of at
    least BYTEPS_MIN_COMPRESS_BYTES are compressed on their way to the
    servers, each compressed alone. ``optimizer`` (Keras 3 or TF1; not in Horovod's
    signature) is the one that applies the gradients: its learning rate
    goes with each push (error feedback rescales by its change; without
    an optimizer, by 1), and ``"momentum": "nesterov"`` takes its momentum
    factor and sets its own momentum to 0 (pass the tape the optimizer
    before its first update).

    With BYTEPS_ENABLE_ASYNC=1, ``gradient()`` returns local gradients and
    exchanges the previous update with the servers (module docstring);
    compression and process sets are refused with a ValueError.
    """
    async_mode = asynchronous("DistributedGradientTape", compression, compression_params, process_set)
    check_process_set(process_set)
    if isinstance(gradtape, _DistributedGradientTape):
        raise ValueError("this tape is already a DistributedGradientTape; wrap the original tape once")
    if not isinstance(gradtape, tf.GradientTape):
        raise TypeError(f"DistributedGradientTape wraps a tf.GradientTape, got {type(gradtape).__name__}")
    prefix = "DistributedGradientTape"
    compression, compressed = take_compression_params(compression_params, optimizer, compression, prefix,
                                                      "DistributedGradientTape")
    reducer = GradientReducer(prefix, compression, sparse_as_dense, op, gradient_predivide_factor, compressed,
                              scale_local_gradients, process_set)
    base = type(gradtape)
    cls = _classes.get(base)
    if cls is None:
        cls = _classes[base] = type(base.__name__, (_DistributedGradientTape, base), {"__module__": base.__module__})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)  # the same recording, watched variables and flags
    tape._byteps_reducer = reducer
    tape._byteps_async = async_mode
    tape._byteps_local = {}
    return tape


def skip_step(optimizer: Any, variables: Any, session: Any = None) -> bool:
    """Backup workers (BYTEPS_BACKUP_WORKERS=b, docs/async.md): skip this step's compute when behind.

    When the servers' answers to the last ``DistributedGradientTape.gradient()``
    said that the next round already closed without this worker (``n - b``
    others pushed it), this pulls that round's averaged gradients from the
    servers without pushing, applies them with ``optimizer`` (a plain Keras
    or TF1 optimizer, the one the tape's gradients go to) to ``variables``
    (the tape's sources, in the same order) and returns True: skip this
    batch's forward and backward pass, as the others applied that round
    without this worker. Otherwise it returns False and does nothing:
    compute the step as usual. Call it eagerly, before the step (which may
    be a ``tf.function``)::

        for x, y in dataset:
            if bps.skip_step(optimizer, model.trainable_variables):
                continue                        # behind: this round closed without us, its update is applied
            train_step(x, y)                    # tape, DistributedGradientTape.gradient(), apply_gradients

    Every worker thus applies the same sequence of averaged gradients and
    the replicas stay identical. It replays the last ``gradient()`` call
    (one per step); only a plain average over every worker can be skipped:
    with ``op=Sum``/``Adasum``, a predivide factor, ``compression_params``, a
    process set, gathered ``tf.IndexedSlices``, or asynchronous training it
    returns False. Horovod has no equivalent.

    In a TF1 graph (a tape in a graph, run by a ``tf.compat.v1.Session``)
    the update is an op, built at the first skip and run in ``session``
    (default: the default session): :mod:`byteps.tensorflow.skipped_rounds`.
    """
    if getattr(optimizer, "_byteps_reducer", None) is not None or isinstance(getattr(optimizer, "_reducer", None),
                                                                             GradientReducer):
        raise ValueError("skip_step(optimizer, variables) applies a DistributedGradientTape's round with the plain "
                         "optimizer its gradients go to; a byteps DistributedOptimizer has its own "
                         "optimizer.skip_step()")
    return apply_skipped_round(last_round("DistributedGradientTape"), tf.nest.flatten(variables),
                               optimizer.apply_gradients, optimizer, session, "skip_step")


def local_layer_variables(local_layers: Any) -> List[Any]:
    """The trainable variables of Horovod's ``local_layers`` argument (a layer, a list of them, or None)."""
    if local_layers is None:
        return []
    if isinstance(local_layers, tf.keras.layers.Layer):
        local_layers = [local_layers]
    local_layers = list(local_layers)
    if not all(isinstance(layer, tf.keras.layers.Layer) for layer in local_layers):
        raise ValueError("local_layers must be Keras layers (a layer or a list of them)")
    return [variable for layer in local_layers for variable in layer.trainable_weights]


def PartialDistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "", device_sparse: str = "",
                                   compression: Any = Compression.none, sparse_as_dense: bool = False,
                                   op: int = Average, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                                   groups: Any = None, process_set: Any = None, local_layers: Any = None,
                                   scale_local_gradients: bool = True) -> tf.GradientTape:
    """Horovod's: a :func:`DistributedGradientTape` whose ``local_layers``' gradients stay on each worker."""
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                                   gradient_predivide_factor, num_groups, groups, process_set, scale_local_gradients)
    for variable in local_layer_variables(local_layers):
        tape.register_local_source(variable)
    return tape
