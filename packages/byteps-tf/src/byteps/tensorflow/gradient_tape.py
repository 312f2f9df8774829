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
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import tensorflow as tf

from byteps.common.frontend.reductions import Average
from byteps.tensorflow.compression import Compression
from byteps.tensorflow.gradient_compression import take_compression_params
from byteps.tensorflow.gradients import GradientReducer
from byteps.tensorflow.ops import check_process_set

__all__ = ["DistributedGradientTape"]

_classes: Dict[type, type] = {}


class _DistributedGradientTape(tf.GradientTape):
    _byteps_reducer: GradientReducer

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: Any = tf.UnconnectedGradients.NONE) -> Any:
        """The tape's gradients, averaged (or summed) over all workers; same structure as ``sources``."""
        gradients = super().gradient(target, sources, output_gradients, unconnected_gradients)
        flat = tf.nest.flatten(gradients)
        return tf.nest.pack_sequence_as(gradients, self._byteps_reducer.reduce(flat))


def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "", device_sparse: str = "",
                            compression: Any = Compression.none, sparse_as_dense: bool = False,
                            op: int = Average, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                            groups: Any = None, process_set: Any = None,
                            scale_local_gradients: bool = True, compression_params: Optional[Dict[str, Any]] = None,
                            optimizer: Any = None) -> tf.GradientTape:
    """Wrap ``gradtape`` so that ``gradient()`` returns gradients averaged over all workers.

    Horovod's signature. ``compression=Compression.fp16`` sends float16;
    ``sparse_as_dense=True`` densifies ``tf.IndexedSlices`` gradients, which
    are otherwise gathered from every rank (see
    :mod:`byteps.tensorflow.gradients`); ``op`` is ``Average`` or ``Sum``.
    All gradients of one ``gradient()`` call travel as one group (byteps
    pipelines them), so ``num_groups``/``groups`` are accepted and ignored,
    as are the device arguments and ``scale_local_gradients`` (no local
    variables here).

    ``compression_params`` is BytePS's gradient compression (the dict of
    docs/compression.md, as on ``DistributedOptimizer``): gradients of at
    least BYTEPS_MIN_COMPRESS_BYTES are compressed on their way to the
    servers, one by one. ``optimizer`` (Keras 3 or TF1; not in Horovod's
    signature) is the one that applies the gradients: its learning rate
    goes with each push (error feedback rescales by its change; without
    an optimizer, by 1), and ``"momentum": "nesterov"`` takes its momentum
    factor and sets its own momentum to 0 (pass the tape the optimizer
    before its first update).
    """
    check_process_set(process_set)
    if isinstance(gradtape, _DistributedGradientTape):
        raise ValueError("this tape is already a DistributedGradientTape; wrap the original tape once")
    if not isinstance(gradtape, tf.GradientTape):
        raise TypeError(f"DistributedGradientTape wraps a tf.GradientTape, got {type(gradtape).__name__}")
    prefix = "DistributedGradientTape"
    compression, compressed = take_compression_params(compression_params, optimizer, compression, prefix,
                                                      "DistributedGradientTape")
    reducer = GradientReducer(prefix, compression, sparse_as_dense, op, gradient_predivide_factor, compressed)
    base = type(gradtape)
    cls = _classes.get(base)
    if cls is None:
        cls = _classes[base] = type(base.__name__, (_DistributedGradientTape, base), {"__module__": base.__module__})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)  # the same recording, watched variables and flags
    tape._byteps_reducer = reducer
    return tape
