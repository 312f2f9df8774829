"""Gradient compression as BytePS defines it: onebit, topk, randomk, dithering, error feedback, Nesterov.

Written once here for every adapter and the server: the user's
``compression_params`` (:mod:`.spec`), the codecs over the C++ kernels
(:mod:`.codec`), and the state around them on workers and servers
(:mod:`.feedback`), and the warning adapters give when error feedback meets
their optimizer's own momentum (:mod:`.momentum_advice`). The worker core
runs them as the COMPRESS and DECOMPRESS stages of a partition's route; see
docs/compression.md.
"""

from byteps.common.compression.codec import COMPRESSIBLE_DTYPES, PartitionCodec, sparse_count
from byteps.common.compression.feedback import LR_BYTES, NesterovMomentum, ServerPartition, WorkerPartition
from byteps.common.compression.momentum_advice import FeedbackMomentumWarning, warn_if_feedback_meets_momentum
from byteps.common.compression.spec import (
    COMPRESSORS,
    CompressionSpec,
    parse_compression_params,
)

__all__ = [
    "COMPRESSIBLE_DTYPES", "COMPRESSORS", "LR_BYTES", "CompressionSpec", "FeedbackMomentumWarning",
    "NesterovMomentum", "PartitionCodec", "ServerPartition", "WorkerPartition", "parse_compression_params",
    "sparse_count", "warn_if_feedback_meets_momentum",
]
