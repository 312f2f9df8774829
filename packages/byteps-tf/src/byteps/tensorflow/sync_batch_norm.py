"""Horovod's ``SyncBatchNormalization`` for Keras: batch statistics over every worker's batch.

It subclasses the BatchNormalization of the Keras ``tf.keras`` names: Keras 3,
or Keras 2 with TF_USE_LEGACY_KERAS=1 (:mod:`byteps.tensorflow.which_keras`).

A drop-in for ``keras.layers.BatchNormalization`` when each worker's batch is
too small for good statistics::

    model = keras.Sequential([keras.layers.Dense(64), bps.SyncBatchNormalization(), ...])

In training, each worker sums, per channel, its element count, its values
and their squares, and one allreduce (Sum, in float64) makes the sums of all
workers; the mean and variance come from those. Unlike Horovod's (which
averages the workers' means, right only when every batch has the same size),
batches of different sizes give the statistics of the whole global batch.
Masks count as in Keras. The allreduce is differentiable (its gradient is
the Sum of the upstream gradients), so the backward pass reaches every
worker's inputs, eagerly and inside ``tf.function``. Moving statistics are
updated from the global ones, so they stay equal on every worker. At
inference the layer is Keras's own.

Every worker must call the layer the same number of times in the same order
(it is a collective), as with every byteps op.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import tensorflow as tf

from byteps.common.frontend.process import size
from byteps.common.frontend.reductions import Sum
from byteps.tensorflow.which_keras import KERAS2, keras

__all__ = ["SyncBatchNormalization"]


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """``keras.layers.BatchNormalization`` whose training statistics cover every worker's batch."""

    def __init__(self, fused: Optional[bool] = False, **kwargs: Any) -> None:
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=True (as in Horovod): leave fused out")
        if kwargs.get("synchronized"):
            raise ValueError("SyncBatchNormalization synchronizes through byteps: leave synchronized out "
                             "(Keras's synchronized=True needs a tf.distribute strategy)")
        kwargs.setdefault("name", "sync_batch_normalization")
        if KERAS2:
            kwargs["fused"] = False  # Keras 2 would otherwise take its fused kernel, which never calls _moments
        super().__init__(**kwargs)

    if KERAS2:
        def _calculate_mean_and_var(self, inputs: tf.Tensor, reduction_axes: Any, keep_dims: bool,
                                    mask: Optional[tf.Tensor] = None) -> Tuple[tf.Tensor, tf.Tensor]:
            if size() == 1:
                return super()._calculate_mean_and_var(inputs, reduction_axes, keep_dims, mask=mask)
            return _global_moments(inputs, list(reduction_axes), mask, self.name, keep_dims)
    else:
        def _moments(self, inputs: tf.Tensor, mask: Optional[tf.Tensor]) -> Tuple[tf.Tensor, tf.Tensor]:
            if size() == 1:
                return super()._moments(inputs, mask)
            return _global_moments(inputs, self._reduction_axes, mask, self.name, False)


def _global_moments(inputs: tf.Tensor, axes: Any, mask: Optional[tf.Tensor], name: str,
                    keep_dims: bool) -> Tuple[tf.Tensor, tf.Tensor]:
    """Mean and variance over ``axes`` of every worker's ``inputs`` (masked entries left out), in one allreduce."""
    from byteps.tensorflow.ops import allreduce

    values = tf.cast(inputs, tf.float64)
    if mask is None:
        weights = tf.ones_like(values)
    else:
        weights = tf.cast(tf.broadcast_to(tf.expand_dims(tf.cast(mask, tf.bool), -1), tf.shape(values)),
                          tf.float64)
    local = tf.stack([tf.reduce_sum(weights, axes, keepdims=keep_dims),
                      tf.reduce_sum(values * weights, axes, keepdims=keep_dims),
                      tf.reduce_sum(tf.square(values) * weights, axes, keepdims=keep_dims)])
    count, total, squares = tf.unstack(allreduce(local, op=Sum, name=f"SyncBatchNormalization.{name}"))
    mean = total / count
    variance = tf.maximum(squares / count - tf.square(mean), 0.0)
    return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)
