"""Gradient compression with Horovod's Compressor interface, on TensorFlow tensors.

The compressors are byteps-common's front (:mod:`byteps.common.frontend.compression`)
bound to tf.Tensor. ``Compression.fp16`` sends floating-point tensors as
float16, halving the bytes of float32 ones; the servers sum float16 in
float32 and round once.

Example::

    bps.allreduce(grad, compression=bps.Compression.fp16)
    tape = bps.DistributedGradientTape(tape, compression=bps.Compression.fp16)
"""

from __future__ import annotations

import tensorflow as tf

from byteps.common.frontend.binding import TensorBinding
from byteps.common.frontend.compression import Compressor, NoneCompressor, compression_for

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression", "TENSORFLOW"]


TENSORFLOW = TensorBinding(float16=tf.float16, bfloat16=tf.bfloat16,
                           dtype=lambda t: t.dtype, is_floating=lambda t: t.dtype.is_floating,
                           cast=tf.cast)
Compression = compression_for(TENSORFLOW, __name__)
FP16Compressor = Compression.fp16
