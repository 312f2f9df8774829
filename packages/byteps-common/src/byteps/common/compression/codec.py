"""One partition's compressor: BytePS's four codecs over the C++ kernels of ``byteps.common._C``.

A :class:`PartitionCodec` knows its partition's element count and dtype,
so the size of what it sends is fixed (:attr:`PartitionCodec.nbytes`) and
buffers are allocated once. Workers and servers build the same codec from
the same :class:`~byteps.common.compression.spec.CompressionSpec`; the
random generator of randomk and dithering (BytePS's xorshift128+) starts
from the seed, the same on every worker and server, and keeps its state
from round to round, as in BytePS::

    codec = PartitionCodec(spec, DType.FLOAT32, count=1000)
    out = np.empty(codec.nbytes, np.uint8)
    codec.compress(gradient, out)          # consumes random draws for randomk/dithering
    codec.decompress(out, dense)
    codec.compress(gradient, out, error=e) # and e = gradient - decompressed out, in the same pass

Encodings (docs/compression.md): onebit as BytePS (sign words, most
significant bit first, then a float32 scale); topk and randomk as records
of (uint32 index, value); dithering as a fixed-width field per element
(sign bit, level code) and a float32 scale, which decodes to the values of
BytePS's Elias-delta stream for the same input and draws.
"""

from __future__ import annotations

import os
from typing import Optional

import numpy as np

from byteps.common import _C
from byteps.common.compression.spec import CompressionSpec
from byteps.common.dtypes import DType

__all__ = ["PartitionCodec", "COMPRESSIBLE_DTYPES", "sparse_count"]

COMPRESSIBLE_DTYPES = (DType.FLOAT16, DType.FLOAT32, DType.FLOAT64)


def sparse_count(k: float, count: int) -> int:
    """topk/randomk's k for a partition of ``count`` elements: ``k`` itself when >= 1, else that fraction of
    the elements (at least one); never more than the partition holds (BytePS's fatal ``k <= n/2`` check is
    a clamp here, so a short last partition is sent whole)."""
    chosen = int(k) if k >= 1 else max(1, int(k * count))
    return max(1, min(chosen, count))


class PartitionCodec:
    """Compresses and decompresses one partition of ``count`` elements of ``dtype``."""

    def __init__(self, spec: CompressionSpec, dtype: DType, count: int) -> None:
        if DType(dtype) not in COMPRESSIBLE_DTYPES:
            raise ValueError(f"compression_params: the {spec.compressor} compressor takes float16, float32 or "
                             f"float64 tensors, not {DType(dtype).name.lower()}")
        self.spec, self.dtype, self.count = spec, DType(dtype), count
        seed = spec.seed if spec.seed is not None else int.from_bytes(os.urandom(4), "little") or 1
        self.state = np.array([seed, seed], dtype=np.uint64)  # xorshift128+ as BytePS seeds it: a = b = seed
        name = spec.compressor
        if name == "onebit":
            self.nbytes = _C.onebit_compressed_nbytes(count, int(dtype))
        elif name in ("topk", "randomk"):
            self.k = sparse_count(spec.k, count)
            self.nbytes = _C.sparse_compressed_nbytes(self.k, int(dtype))
        elif name == "dithering":
            self.levels = int(spec.k)
            self.nbytes = _C.dithering_compressed_nbytes(count, self.levels)
        else:
            raise ValueError(f"no codec for compressor {name!r}")

    def compress(self, dense: np.ndarray, out: np.ndarray, error: Optional[np.ndarray] = None) -> None:
        """``out`` (``nbytes`` bytes) = the compressed ``dense`` (``count`` elements of the dtype).

        With ``error`` (``count`` elements, not overlapping ``out``; ``dense`` itself allowed), also
        error feedback's ``error = dense - decompress(out)``, computed by the compressing kernel in
        the same pass, bit for bit what :meth:`decompress` into ``error`` followed by
        ``np.subtract(dense, error, out=error)`` gives.
        """
        name, dtype = self.spec.compressor, int(self.dtype)
        if name == "onebit":
            _C.onebit_compress(dense, out, dtype, self.spec.scaling, error=error)
        elif name == "topk":
            _C.topk_compress(dense, out, dtype, self.k, error=error)
        elif name == "randomk":
            _C.randomk_compress(dense, out, dtype, self.k, self.state, error=error)
        else:
            _C.dithering_compress(dense, out, dtype, self.levels, self.spec.natural, self.spec.l2, self.state,
                                  error=error)

    def decompress(self, compressed, dense: np.ndarray) -> None:
        """``dense`` (``count`` elements) = the values ``compressed`` stands for."""
        name, dtype = self.spec.compressor, int(self.dtype)
        if name == "onebit":
            _C.onebit_decompress(compressed, dense, dtype)
        elif name in ("topk", "randomk"):
            _C.sparse_decompress(compressed, dense, dtype)
        else:
            _C.dithering_decompress(compressed, dense, dtype, self.levels, self.spec.natural)
