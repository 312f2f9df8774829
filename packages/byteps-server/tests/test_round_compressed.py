"""Compressed keys: the codec the sum policies go through, driven over the real engine (round_driver.py).

top-k with k = every element keeps each value, so the answers can be compared exactly.
"""

import numpy as np
import pytest
from round_driver import RoundDriver, spec_of

from byteps.common.compression import CompressionSpec, WorkerPartition
from byteps.common.dtypes import DType
from byteps.common.tensor_description import split_quorum_aux
from byteps.server.rounds import QuorumSum, SyncSum
from byteps.transport import Command
from byteps.transport.frames import FLAG_AVERAGE, FLAG_ZEROS

COUNT = 4
LOSSLESS = CompressionSpec("topk", k=COUNT)


def compressed(values):
    """What a worker pushes for ``values``: the compressed partition and the learning rate."""
    worker = WorkerPartition(LOSSLESS, DType.FLOAT32, COUNT)
    return bytes(worker.compress(np.asarray(values, np.float32).view(np.uint8), 0.1, 1.0))


def decompressed(payload):
    dense = np.zeros(COUNT, np.float32)
    WorkerPartition(LOSSLESS, DType.FLOAT32, COUNT).decompress(np.frombuffer(payload, np.uint8), dense.view(np.uint8))
    return dense.tolist()


def test_compressed_round_sums_the_decompressed_pushes_and_answers_the_sum_compressed():
    server = RoundDriver(machines=2)
    policy = server.declare(0, spec_of(COUNT, compression=LOSSLESS.wire()))
    assert type(policy) is SyncSum and policy.codec is not None
    server.push(0, 0, 0, payload=compressed([1, 2, 3, 4]))
    server.push(0, 1, 0, payload=compressed([10, 20, 30, 40]))
    server.pull(0, 0, 0)
    sent = server.take(Command.PULL_RESPONSE)
    assert len(sent[0].payload) == policy.codec.partition.codec.nbytes  # the compressed form, not the dense sum
    assert decompressed(sent[0].payload) == [11, 22, 33, 44]
    with pytest.raises(ValueError):  # the engine's sum went at the close: the compressed copy answers
        server.engine.result(0, 0)


def test_compressed_round_keeps_the_answers_of_the_last_two_rounds():
    server = RoundDriver(machines=2)
    policy = server.declare(0, spec_of(COUNT, compression=LOSSLESS.wire()))
    for round_ in range(3):
        server.push(0, 0, round_, payload=compressed([round_] * COUNT))
        server.push(0, 1, round_, payload=compressed([1] * COUNT))
    assert sorted(policy.codec.answers) == [1, 2]
    server.pull(0, 1, 2)
    assert [decompressed(s.payload) for s in server.take(Command.PULL_RESPONSE)] == [[3, 3, 3, 3]]


def test_compressed_quorum_round_keeps_its_compressed_answer_in_history():
    server = RoundDriver(machines=3)
    policy = server.declare(0, spec_of(COUNT, compression=LOSSLESS.wire(), quorum=2))
    assert isinstance(policy, QuorumSum) and policy.codec is not None
    server.push(0, 0, 0, payload=compressed([1, 1, 1, 1]), flags=FLAG_AVERAGE)
    server.push(0, 1, 0, payload=compressed([2, 2, 2, 2]), flags=FLAG_AVERAGE)
    server.push(0, 2, 0, payload=compressed([100, 100, 100, 100]), flags=FLAG_AVERAGE)  # late: dropped
    server.pull(0, 2, 0)
    sent = server.take(Command.PULL_RESPONSE)
    assert [split_quorum_aux(s.aux) for s in sent] == [(2, 0)]
    assert decompressed(sent[0].payload) == [3, 3, 3, 3]


def test_a_compressed_push_flagged_zeros_is_refused():
    server = RoundDriver(machines=2)
    server.declare(0, spec_of(COUNT, compression=LOSSLESS.wire()))
    with pytest.raises(ValueError, match="flagged zeros must carry no payload and an uncompressed key"):
        server.push(0, 0, 0, flags=FLAG_ZEROS)
