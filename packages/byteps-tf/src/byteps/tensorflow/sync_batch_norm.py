"""Horovod's ``SyncBatchNormalization`` for Keras 3: batch statistics over every worker's batch.

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

import keras
import tensorflow as tf

from byteps.common.frontend.process import size
from byteps.common.frontend.reductions import Sum

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
        super().__init__(**kwargs)

    def _moments(self, inputs: tf.Tensor, mask: Optional[tf.Tensor]) -> Tuple[tf.Tensor, tf.Tensor]:
        if size() == 1:
            return super()._moments(inputs, mask)
        from byteps.tensorflow.ops import allreduce

        axes = self._reduction_axes
        values = tf.cast(inputs, tf.float64)
        if mask is None:
            weights = tf.ones_like(values)
        else:
            weights = tf.cast(tf.broadcast_to(tf.expand_dims(tf.cast(mask, tf.bool), -1), tf.shape(values)),
                              tf.float64)
        local = tf.stack([tf.reduce_sum(weights, axes), tf.reduce_sum(values * weights, axes),
                          tf.reduce_sum(tf.square(values) * weights, axes)])
        count, total, squares = tf.unstack(allreduce(local, op=Sum, name=f"SyncBatchNormalization.{self.name}"))
        mean = total / count
        variance = tf.maximum(squares / count - tf.square(mean), 0.0)
        return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)
