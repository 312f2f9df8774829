"""Gradient compression as BytePS defines it: onebit, topk, randomk, dithering, error feedback, Nesterov.

Written once here for every adapter and the server: the user's
``compression_params`` (:mod:`.spec`), the codecs over the C++ kernels
(:mod:`.codec`), and the state around them on workers and servers
(:mod:`.feedback`). The worker core runs them as the COMPRESS and
DECOMPRESS stages of a partition's route; see docs/compression.md.
"""

from byteps.common.compression.codec import COMPRESSIBLE_DTYPES, PartitionCodec, sparse_count
from byteps.common.compression.feedback import LR_BYTES, NesterovMomentum, ServerPartition, WorkerPartition
from byteps.common.compression.spec import (
    COMPRESSORS,
    CompressionSpec,
    parse_compression_params,
)

__all__ = [
    "COMPRESSIBLE_DTYPES", "COMPRESSORS", "LR_BYTES", "CompressionSpec",
    "NesterovMomentum", "PartitionCodec", "ServerPartition", "WorkerPartition", "parse_compression_params",
    "sparse_count",
]
