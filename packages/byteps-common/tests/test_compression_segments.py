"""A fused bucket's compressed partition: each member (segment) compressed exactly as if it went alone.

A member of a bucket must give, byte for byte, the payload, the error and
the decompressed values that the same tensor gives as a partition of its
own (its own codec, generator and error), on the worker and on the server,
round after round; and the server must take the segments from INIT_KEY's
fields. Real jobs: the torch, TF and MXNet compression tests.
"""

import numpy as np
import pytest

from byteps.common.compression import CompressionSpec, ServerPartition, WorkerPartition
from byteps.common.compression.feedback import TensorCompressor
from byteps.common.compression.segments import SegmentedCodec, codec_for
from byteps.common.dtypes import DType

SEGMENTS = [7, 200, 1, 33]
SPECS = {
    "onebit-scaling": {"compressor": "onebit", "scaling": True},
    "topk": {"compressor": "topk", "k": 0.25},
    "randomk": {"compressor": "randomk", "k": 3, "seed": 9},
    "dithering-natural": {"compressor": "dithering", "k": 3.0, "natural": True, "seed": 4},
}


def gradient(count, seed, dtype=np.float32):
    return np.random.default_rng(seed).normal(size=count).astype(dtype)


@pytest.mark.parametrize("name", list(SPECS))
def test_each_segment_compresses_as_its_own_partition_round_after_round(name):
    spec = CompressionSpec(**SPECS[name], ef=True, momentum=0.5)
    total = sum(SEGMENTS)
    bucket = WorkerPartition(spec, DType.FLOAT32, total, SEGMENTS)
    alone = [WorkerPartition(spec, DType.FLOAT32, count) for count in SEGMENTS]
    server = ServerPartition.from_wire(TensorCompressor(spec, DType.FLOAT32, SEGMENTS).wire(), DType.FLOAT32, total)
    servers_alone = [ServerPartition(spec, DType.FLOAT32, count) for count in SEGMENTS]
    assert bucket.codec.nbytes == sum(part.codec.nbytes for part in alone)
    bounds = np.cumsum([0] + SEGMENTS)
    for step, lr in enumerate([0.1, 0.08, 0.08]):
        grad = gradient(total, step)
        payload = bucket.compress(grad.view(np.uint8), lr, 0.5)
        pieces = [part.compress(grad[a:b].copy().view(np.uint8), lr, 0.5)[:part.codec.nbytes].tobytes()
                  for part, a, b in zip(alone, bounds, bounds[1:])]
        assert payload[:bucket.codec.nbytes].tobytes() == b"".join(pieces)
        assert bucket.error.tobytes() == np.concatenate([part.error for part in alone]).tobytes()

        dense, sent_lr = server.decompress_push(payload.tobytes())
        assert sent_lr == lr
        answer = server.compress_sum(dense.tobytes(), sent_lr)
        expected = []
        for part, piece in zip(servers_alone, pieces):
            piece_dense, _ = part.decompress_push(piece + payload[bucket.codec.nbytes:].tobytes())
            expected.append(part.compress_sum(piece_dense.tobytes(), sent_lr).tobytes())
        assert answer.tobytes() == b"".join(expected)

        result = np.empty(total, np.float32)
        bucket.decompress(answer, result.view(np.uint8))
        for part, piece_answer, a, b in zip(alone, expected, bounds, bounds[1:]):
            piece = np.empty(b - a, np.float32)
            part.decompress(piece_answer, piece.view(np.uint8))
            np.testing.assert_array_equal(result[a:b], piece)


def test_segments_must_cover_the_partition_with_positive_counts():
    spec = CompressionSpec("onebit")
    with pytest.raises(ValueError, match="add up to 10 elements, but the partition has 11"):
        codec_for(spec, DType.FLOAT32, 11, [4, 6])
    with pytest.raises(ValueError, match="positive element counts"):
        SegmentedCodec(spec, DType.FLOAT32, [4, 0, 6])
    assert TensorCompressor(spec, DType.FLOAT32).wire() == spec.wire()  # no segments: the plain spec
    assert TensorCompressor(spec, DType.FLOAT32, [4, 6]).matches(spec, DType.FLOAT32, (4, 6))
    assert not TensorCompressor(spec, DType.FLOAT32, [4, 6]).matches(spec, DType.FLOAT32, None)
