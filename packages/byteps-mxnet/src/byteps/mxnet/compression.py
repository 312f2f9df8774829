"""Gradient compression with Horovod's Compressor interface, on NDArrays.

The compressors are byteps-common's front (:mod:`byteps.common.frontend.compression`)
bound to NDArrays; their casts are MXNet operators (engine ops).
``Compression.fp16`` halves the bytes of float32/float64 gradients on the
wire; the servers sum float16 in float32 and round once.

Example::

    trainer = bps.DistributedTrainer(params, "sgd", compression=bps.Compression.fp16)
"""

from __future__ import annotations

import numpy as np

from byteps.common.frontend.binding import TensorBinding
from byteps.common.frontend.compression import Compressor, NoneCompressor, compression_for

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression", "MXNET"]


#: NDArrays, their dtypes as numpy's
MXNET = TensorBinding(float16=np.dtype(np.float16), dtype=lambda a: np.dtype(a.dtype),
                      is_floating=lambda a: np.dtype(a.dtype).kind == "f", cast=lambda a, dtype: a.astype(dtype))
Compression = compression_for(MXNET, __name__)
FP16Compressor = Compression.fp16
