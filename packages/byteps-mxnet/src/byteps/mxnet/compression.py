"""Gradient compression with Horovod's Compressor interface, on NDArrays.

``compress(array) -> (array, ctx)`` gives what is push_pulled,
``decompress(array, ctx)`` turns it back. ``Compression.fp16`` halves the
bytes of float32/float64 gradients on the wire; the servers sum float16 in
float32 and round once. Both are MXNet operators (engine ops).

Example::

    trainer = bps.DistributedTrainer(params, "sgd", compression=bps.Compression.fp16)
"""

from __future__ import annotations

from typing import Any, Tuple

import mxnet as mx
import numpy as np

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression"]


class Compressor:
    """Interface: ``compress(array) -> (array, ctx)``, ``decompress(array, ctx) -> array``."""

    @staticmethod
    def compress(tensor: mx.nd.NDArray) -> Tuple[mx.nd.NDArray, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: mx.nd.NDArray, ctx: Any) -> mx.nd.NDArray:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends the array as it is."""

    @staticmethod
    def compress(tensor: mx.nd.NDArray) -> Tuple[mx.nd.NDArray, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: mx.nd.NDArray, ctx: Any) -> mx.nd.NDArray:
        return tensor


class FP16Compressor(Compressor):
    """Sends float32/float64 arrays as float16; other dtypes as they are."""

    @staticmethod
    def compress(tensor: mx.nd.NDArray) -> Tuple[mx.nd.NDArray, Any]:
        dtype = np.dtype(tensor.dtype)
        if dtype.kind == "f" and dtype != np.float16:
            return tensor.astype("float16"), dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: mx.nd.NDArray, ctx: Any) -> mx.nd.NDArray:
        return tensor if ctx is None else tensor.astype(ctx)


class Compression:
    """The available compressors, as in Horovod: ``Compression.none``, ``Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
