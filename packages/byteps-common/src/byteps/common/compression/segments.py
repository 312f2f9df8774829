"""A fused bucket's partition whose members are compressed each alone: one codec per segment.

When small compressed tensors share a bucket (byteps.common.fusion), the
bucket is one partition and one message, but BytePS's compressors are
defined per tensor partition: onebit's scale, topk's k, the random
generator's stream. So each member (a *segment*, given by its element
count) keeps a :class:`~byteps.common.compression.codec.PartitionCodec` of
its own, seeded as if it went alone, and the payload is the segments'
compressed bytes one after the other. Workers and servers build the same
segments from the same counts (they travel in INIT_KEY), so a member
compressed inside a bucket gives, bit for bit, what it gives alone::

    codec = SegmentedCodec(spec, DType.FLOAT32, segments=[200, 5000])
    out = np.empty(codec.nbytes, np.uint8)
    codec.compress(bucket, out, error=error)     # each segment as its own partition
    codec.decompress(out, bucket)
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np

from byteps.common.compression.codec import PartitionCodec
from byteps.common.compression.spec import CompressionSpec
from byteps.common.dtypes import DType

__all__ = ["SegmentedCodec", "codec_for"]


class SegmentedCodec:
    """Compresses and decompresses a partition of consecutive segments, each with its own codec."""

    def __init__(self, spec: CompressionSpec, dtype: DType, segments: Sequence[int]) -> None:
        counts = [int(count) for count in segments]
        if not counts or any(count < 1 for count in counts):
            raise ValueError(f"segments must be positive element counts, got {list(segments)}")
        self.spec, self.dtype, self.count = spec, DType(dtype), sum(counts)
        self.codecs = [PartitionCodec(spec, dtype, count) for count in counts]
        self._elements = np.cumsum([0] + counts)                            # each segment's first element
        self._bytes = np.cumsum([0] + [codec.nbytes for codec in self.codecs])  # and its first payload byte
        self.nbytes = int(self._bytes[-1])

    def compress(self, dense: np.ndarray, out: np.ndarray, error: Optional[np.ndarray] = None) -> None:
        """``out`` = each segment of ``dense`` compressed by its codec, one after the other (see PartitionCodec)."""
        for i, codec in enumerate(self.codecs):
            span = slice(self._elements[i], self._elements[i + 1])
            codec.compress(dense[span], out[self._bytes[i]:self._bytes[i + 1]],
                           error=None if error is None else error[span])

    def decompress(self, compressed, dense: np.ndarray) -> None:
        """``dense`` = every segment's values, decompressed by its codec."""
        view = memoryview(compressed).cast("B")
        for i, codec in enumerate(self.codecs):
            codec.decompress(view[self._bytes[i]:self._bytes[i + 1]], dense[self._elements[i]:self._elements[i + 1]])


def codec_for(spec: CompressionSpec, dtype: DType, count: int,
              segments: Optional[Sequence[int]] = None) -> Union[PartitionCodec, SegmentedCodec]:
    """A partition's codec: one over its ``count`` elements, or one per segment of a fused bucket."""
    if segments is None:
        return PartitionCodec(spec, dtype, count)
    codec = SegmentedCodec(spec, dtype, segments)
    if codec.count != count:
        raise ValueError(f"segments {list(segments)} add up to {codec.count} elements, "
                         f"but the partition has {count}")
    return codec
