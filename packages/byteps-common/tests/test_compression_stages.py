"""The COMPRESS and DECOMPRESS stages on a pool of threads (BYTEPS_THREADPOOL_SIZE) against the same stages inline.

A pool must give each partition exactly the bytes the communication
thread gives it, hand every trip back once through ``finished`` from a
pool thread, and turn a codec that raises into that trip's error without
losing the pool. The real job: the torch compression test with a pool of 2.
"""

import threading
import types

import numpy as np
import pytest

from byteps.common.compression import CompressionSpec
from byteps.common.compression.feedback import TensorCompressor
from byteps.common.compression.stages import CompressionStages
from byteps.common.dtypes import DType
from byteps.common.partition import PartitionPlan
from byteps.common.route import PartitionTrip, Stage, plan_route

COUNT, PARTITION_BYTES = 40_000, 16_000  # 10 partitions of 4000 float32
SPEC = CompressionSpec("onebit", scaling=True, ef=True)


def _task(seed):
    """One push_pull's fields the stages read: its input and output, state, lr and averaging."""
    data = np.random.default_rng(seed).normal(size=COUNT).astype(np.float32)
    return types.SimpleNamespace(source=types.SimpleNamespace(data=data.view(np.uint8)),
                                 output=types.SimpleNamespace(data=np.zeros(COUNT * 4, np.uint8)),
                                 compression=TensorCompressor(SPEC, DType.FLOAT32), lr=0.1, average_over=2)


def _trips(task):
    route = plan_route(None, True, compressed=True)
    plan = PartitionPlan.build(1, COUNT * 4, 4, PARTITION_BYTES, 1)
    trips = []
    for part in plan.partitions:
        trip = PartitionTrip(task, part, route)
        trip.position = route.index(Stage.COMPRESS)
        trips.append(trip)
    return trips


class _Collect:
    """``finished``: records each trip, its error and the thread that handed it back."""

    def __init__(self, expected):
        self.results, self.threads = [], set()
        self._changed = threading.Condition()
        self._expected = expected

    def __call__(self, trip, error):
        with self._changed:
            self.results.append((trip, error))
            self.threads.add(threading.current_thread().name)
            self._changed.notify_all()

    def wait(self, count=None):
        count = self._expected if count is None else count
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.results) >= count, 30), \
                f"{len(self.results)} of {count} trips came back"


def _round(stages_for, seed):
    """Compress every partition, then decompress each payload; the trips' final dense bytes and payloads."""
    task = _task(seed)
    trips = _trips(task)
    inline = []
    stages, collect = stages_for(len(trips), inline)
    for trip in trips:
        stages.compress(trip)
    if collect:
        collect.wait()
        assert sorted(id(t) for t, e in collect.results) == sorted(id(t) for t in trips)
        assert all(e is None for _, e in collect.results)
    payloads = [bytes(np.asarray(trip.data, np.uint8)) for trip in trips]
    stages2, collect2 = stages_for(len(trips), inline)
    for trip in trips:
        trip.position = trip.route.index(Stage.DECOMPRESS)
        # the server's answer has the codec's bytes of a push (the push adds the lr after them)
        trip.data = trip.data[:task.compression.partition(trip.part.index, trip.part.nbytes).codec.nbytes]
        stages2.decompress(trip)
    if collect2:
        collect2.wait()
    for stage in (stages, stages2):
        stage.close()
    return payloads, bytes(task.output.data), (collect, collect2)


def test_a_pool_gives_every_partition_the_bytes_of_the_inline_stages():
    def inline_stages(count, proceeded):
        return CompressionStages(proceeded.append), None

    def pooled_stages(count, proceeded):
        collect = _Collect(count)
        return CompressionStages(proceeded.append, threads=2, finished=collect), collect

    base_payloads, base_output, _ = _round(inline_stages, seed=3)
    payloads, output, collects = _round(pooled_stages, seed=3)
    assert payloads == base_payloads
    assert output == base_output and any(output)
    for collect in collects:
        assert collect.threads and all(name.startswith("byteps-compress") for name in collect.threads)


def test_a_codec_that_raises_fails_its_trip_and_the_pool_goes_on():
    task = _task(5)
    trips = _trips(task)
    collect = _Collect(len(trips) + 2)
    stages = CompressionStages(lambda trip: pytest.fail("a pooled stage must not proceed itself"),
                               threads=2, finished=collect)
    for trip in trips:
        stages.compress(trip)
    collect.wait(len(trips))
    assert all(error is None for _, error in collect.results)
    bad, good = trips[0], trips[1]
    for trip in (bad, good):
        trip.position = trip.route.index(Stage.DECOMPRESS)
        trip.data = trip.data[:task.compression.partition(trip.part.index, trip.part.nbytes).codec.nbytes]
    bad.data = bad.data[:3]  # a truncated answer: the codec refuses it
    stages.decompress(bad)
    stages.decompress(good)
    collect.wait()
    errors = {id(trip): error for trip, error in collect.results[len(trips):]}
    assert isinstance(errors[id(bad)], ValueError) and "src has 3 bytes" in str(errors[id(bad)])
    assert errors[id(good)] is None
    stages.close()


def test_a_pool_needs_somewhere_to_hand_trips_back():
    with pytest.raises(ValueError, match="finished callback"):
        CompressionStages(lambda trip: None, threads=2)
