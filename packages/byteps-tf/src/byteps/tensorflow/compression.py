"""Gradient compression with Horovod's Compressor interface.

A compressor turns a tensor into what is sent (``compress`` returns the
tensor to push_pull and a context) and back (``decompress(tensor, ctx)``).
``Compression.fp16`` sends floating-point tensors as float16, halving the
bytes of float32 ones; the servers sum float16 in float32 and round once.

Example::

    bps.allreduce(grad, compression=bps.Compression.fp16)
    tape = bps.DistributedGradientTape(tape, compression=bps.Compression.fp16)
"""

from __future__ import annotations

from typing import Any, Tuple

import tensorflow as tf

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression"]


class Compressor:
    """Interface: ``compress(tensor) -> (tensor, ctx)``, ``decompress(tensor, ctx) -> tensor``."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> Tuple[tf.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends the tensor as it is."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> Tuple[tf.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16; other dtypes as they are."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> Tuple[tf.Tensor, Any]:
        if tensor.dtype.is_floating and tensor.dtype != tf.float16:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        return tensor if ctx is None else tf.cast(tensor, ctx)


class Compression:
    """The available compressors, as in Horovod: ``Compression.none``, ``Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
