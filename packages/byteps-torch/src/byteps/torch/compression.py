"""Gradient compression with Horovod's Compressor interface, on torch tensors.

The compressors are byteps-common's front (:mod:`byteps.common.frontend.compression`)
bound to torch tensors. ``Compression.fp16`` halves the bytes of
float32/float64 tensors on the wire; the servers then sum in float16's
accumulation type (float32) and round once.

Example::

    bps.allreduce(grad, compression=bps.Compression.fp16)
"""

from __future__ import annotations

import torch

from byteps.common.frontend.binding import TensorBinding
from byteps.common.frontend.compression import Compressor, NoneCompressor, compression_for

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression", "TORCH"]


TORCH = TensorBinding(float16=torch.float16, bfloat16=torch.bfloat16,
                      dtype=lambda t: t.dtype, is_floating=lambda t: t.dtype.is_floating_point,
                      cast=lambda t, dtype: t.to(dtype))
Compression = compression_for(TORCH, __name__)
FP16Compressor = Compression.fp16
