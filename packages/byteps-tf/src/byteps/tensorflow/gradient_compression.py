"""BytePS's ``compression_params`` on TensorFlow's gradient wrappers: the optimizer's momentum and learning rate.

The tape and both DistributedOptimizers take the dict of
docs/compression.md and hand the parsed spec to their
:class:`~byteps.tensorflow.gradients.GradientReducer`, whose gradients the
worker core averages, then compresses, each alone (fused apart from the
uncompressed ones).
What is TensorFlow's here:

* ``"momentum": "nesterov"`` takes its factor from the optimizer (Keras:
  ``optimizer.momentum``; TF1 ``MomentumOptimizer``: its momentum) and sets
  the optimizer's own momentum to 0 before it builds its variables, as
  BytePS deletes it. The factor is remembered on the optimizer, so a tape
  wrapped again every step finds it again.
* The learning rate is read when the gradients are reduced (Keras:
  ``optimizer.learning_rate``, a schedule evaluated at the current
  iteration); inside ``tf.function`` it is an input of the push_pull op,
  so the value is the one of the step that runs.
* Gradients that go uncompressed (below BYTEPS_MIN_COMPRESS_BYTES, or no
  servers, or one worker) get the momentum after the pull
  (:class:`~byteps.common.compression.NesterovMomentum`, in numpy; one
  ``py_function`` in a graph), with buffers kept per tensor name across
  steps and wrappers, as the worker core keeps the compressed tensors'.

Example::

    opt = keras.optimizers.SGD(0.1, momentum=0.9)
    opt = bps.DistributedOptimizer(opt, compression_params={"compressor": "onebit", "ef": "vanilla",
                                                            "momentum": "nesterov"})
    assert opt.momentum == 0.0      # byteps applies it, before compression
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from byteps.common import api
from byteps.common.compression import (
    CompressionSpec,
    NesterovMomentum,
    parse_compression_params,
    warn_if_feedback_meets_momentum,
)
from byteps.common.frontend import after_shutdown
from byteps.tensorflow.compression import Compression
from byteps.tensorflow.graph_ops import run_eagerly

__all__ = ["GradientCompression", "take_compression_params"]

#: The momentum factor ``"nesterov"`` took from an optimizer (whose own momentum is then 0).
_TAKEN = "_byteps_nesterov_momentum"

#: Momentum buffers of uncompressed gradients, per wrapper prefix; a new job starts without them.
_momenta: Dict[str, NesterovMomentum] = {}
after_shutdown(_momenta.clear)


@dataclasses.dataclass
class GradientCompression:
    """One wrapper's compression: the spec, where its learning rate comes from, its after-pull momentum."""

    spec: CompressionSpec
    learning_rate: Optional[Callable[[], Any]] = None  # the optimizer's learning rate now; None: unknown
    momentum: Optional[NesterovMomentum] = None  # for gradients that go uncompressed

    def learning_rate_now(self) -> Optional[tf.Tensor]:
        """The learning rate as a float64 scalar (a graph tensor inside tf.function), or None."""
        value = None if self.learning_rate is None else self.learning_rate()
        return None if value is None else tf.cast(tf.convert_to_tensor(value), tf.float64)

    def apply_momentum(self, names: Sequence[str], gradients: List[tf.Tensor], sent_itemsizes: Sequence[int],
                       communicated: bool) -> List[tf.Tensor]:
        """``gradients`` (reduced, decompressed) with the momentum where they went uncompressed.

        ``sent_itemsizes``: bytes per element as sent (2 after an fp16 cast),
        which decide, with the element count, whether the core compressed
        it; with ``communicated`` False (one worker) nothing was sent and
        every gradient gets it.
        """
        momentum, spec = self.momentum, self.spec

        def uncompressed(elements: Optional[int], itemsize: int) -> bool:
            if not communicated or elements is None:  # unknown at trace time: decided when it runs
                return True
            return not api.worker().compresses(elements * itemsize, True, spec)

        chosen = [i for i, (gradient, itemsize) in enumerate(zip(gradients, sent_itemsizes))
                  if uncompressed(gradient.shape.num_elements(), itemsize)]
        if momentum is None or not chosen:
            return gradients

        def body(*tensors: tf.Tensor) -> List[tf.Tensor]:
            results = []
            for i, tensor in zip(chosen, tensors):
                array = np.array(tensor.numpy())  # a writable copy
                if uncompressed(array.size, sent_itemsizes[i]):
                    momentum.apply(names[i], array)
                results.append(tf.convert_to_tensor(array, dtype=tensor.dtype))
            return results

        outputs = run_eagerly(body, [gradients[i] for i in chosen], [gradients[i].dtype for i in chosen],
                              [gradients[i].shape for i in chosen])
        gradients = list(gradients)
        for i, output in zip(chosen, outputs):
            gradients[i] = output
        return gradients


def take_compression_params(params: Optional[Mapping[str, Any]], optimizer: Any, compression: Any, prefix: str,
                            what: str) -> Tuple[Any, Optional[GradientCompression]]:
    """(Horovod compression to use, GradientCompression or None) for a wrapper given ``compression_params``.

    ``optimizer`` (Keras 3 or TF1, or None for a tape without one) gives
    the momentum factor and the learning rate; with ``"nesterov"`` its own
    momentum is turned off. ``"fp16": True`` is ``Compression.fp16``.
    Raises ValueError naming the bad parameter.
    """
    if not params:
        return compression, None
    wants_nesterov = isinstance(params, Mapping) and str(params.get("momentum", "") or "").strip().lower() == "nesterov"
    if wants_nesterov and optimizer is None:
        raise ValueError(f"{what}: compression_params['momentum'] = 'nesterov' takes its factor from the "
                         "optimizer's momentum: pass optimizer= (the one that applies these gradients)")
    mu = _momentum_of(optimizer, what) if wants_nesterov else None
    spec = parse_compression_params(params, mu)
    if spec is None:
        return compression, None
    if spec.fp16 and compression is Compression.none:
        compression = Compression.fp16
    if spec.compressor == "none":  # fp16 alone
        return compression, None
    if spec.momentum is None and optimizer is not None:
        # Error feedback under the optimizer's own momentum can diverge: say so at the user's call.
        warn_if_feedback_meets_momentum(spec, _momentum_of(optimizer, what))
    momentum = None
    if spec.momentum is not None:
        _turn_off_momentum(optimizer, spec.momentum, what)
        momentum = _momenta.get(prefix)
        if momentum is None or momentum.mu != spec.momentum:
            momentum = _momenta[prefix] = NesterovMomentum(spec.momentum)
    return compression, GradientCompression(spec, _learning_rate_reader(optimizer), momentum)


def _is_v1(optimizer: Any) -> bool:
    return isinstance(optimizer, tf.compat.v1.train.Optimizer)


def _momentum_of(optimizer: Any, what: str) -> Optional[float]:
    """The optimizer's momentum factor (the one taken before, once it was turned off); None without one."""
    taken = getattr(optimizer, _TAKEN, None)
    if taken is not None:
        return taken
    value = getattr(optimizer, "_momentum" if _is_v1(optimizer) else "momentum", None)
    if callable(value):
        value = value()
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        static = tf.get_static_value(value)
    if static is None:
        raise ValueError(f"{what}: compression_params['momentum'] = 'nesterov' needs the optimizer's momentum as "
                         f"a number known before training, got {value!r}")
    return float(static)


def _turn_off_momentum(optimizer: Any, mu: float, what: str) -> None:
    """Set the optimizer's own momentum to 0 (byteps applies it), once; remember ``mu`` on it."""
    if getattr(optimizer, _TAKEN, None) is not None:
        return
    if _is_v1(optimizer):
        optimizer._momentum = 0.0  # read by MomentumOptimizer._prepare at each apply_gradients
        if getattr(optimizer, "_use_nesterov", False):
            optimizer._use_nesterov = False
    else:
        if getattr(optimizer, "built", False):
            raise ValueError(f"{what}: compression_params['momentum'] = 'nesterov' turns the optimizer's own "
                             "momentum off, which must happen before it builds its variables: pass it before its "
                             "first update")
        optimizer.momentum = 0.0  # Keras SGD then builds no momentum variables and skips them
        if getattr(optimizer, "nesterov", False):
            optimizer.nesterov = False
    object.__setattr__(optimizer, _TAKEN, mu)


def _learning_rate_reader(optimizer: Any) -> Optional[Callable[[], Any]]:
    """A function returning the optimizer's learning rate now (a float, variable or tensor), or None."""
    if optimizer is None:
        return None
    if _is_v1(optimizer):
        def read_v1() -> Any:
            value = getattr(optimizer, "_learning_rate", None)
            if value is None:
                value = getattr(optimizer, "_lr", None)  # AdamOptimizer
            return value() if callable(value) else value

        return read_v1
    if not hasattr(optimizer, "learning_rate"):
        return None
    return lambda: optimizer.learning_rate
