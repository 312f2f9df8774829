"""The COMPRESS and DECOMPRESS stages on a pool of threads (BYTEPS_THREADPOOL_SIZE) against the same stages inline.

A stage answers OffThread(codec); the dispatcher runs the codec on its pool
and hands the trip back through the engine's queue (``post``), from a pool
thread, once: never moving it on from there. A pool must give each partition
exactly the bytes the inline stage gives it, and turn a codec that raises
into that trip's error without losing the pool. The real job: the torch
compression test with a pool of 2.
"""

import threading
import types

import numpy as np

from byteps.common.compression import CompressionSpec
from byteps.common.compression.feedback import TensorCompressor
from byteps.common.dtypes import DType
from byteps.common.engine.compress import CompressionStages
from byteps.common.engine.dispatcher import Dispatcher, StageDone
from byteps.common.engine.route import Role, Stage, plan_route
from byteps.common.engine.stage import OffThread
from byteps.common.engine.task import PartitionTrip
from byteps.common.partition import PartitionPlan

COUNT, PARTITION_BYTES = 40_000, 16_000  # 10 partitions of 4000 float32
SPEC = CompressionSpec("onebit", scaling=True, ef=True)


def _task(seed):
    """One push_pull's fields the stages read: its input and output, state, lr and averaging."""
    data = np.random.default_rng(seed).normal(size=COUNT).astype(np.float32)
    return types.SimpleNamespace(source=types.SimpleNamespace(data=data.view(np.uint8)),
                                 output=types.SimpleNamespace(data=np.zeros(COUNT * 4, np.uint8)),
                                 compression=TensorCompressor(SPEC, DType.FLOAT32), lr=0.1, average_over=2,
                                 failed=False, round=0)


def _trips(task):
    route = plan_route(Role.ALONE, True, compressed=True)
    plan = PartitionPlan.build(1, COUNT * 4, 4, PARTITION_BYTES, 1)
    trips = []
    for part in plan.partitions:
        trip = PartitionTrip(task, part, route)
        trip.position = route.stages.index(Stage.COMPRESS)
        trips.append(trip)
    return trips


class _Collect:
    """``post``: records each StageDone handed back and the thread that handed it."""

    def __init__(self):
        self.done, self.threads = [], set()
        self._changed = threading.Condition()

    def __call__(self, item):
        with self._changed:
            self.done.append(item)
            self.threads.add(threading.current_thread().name)
            self._changed.notify_all()

    def wait(self, count):
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.done) >= count, 30), \
                f"{len(self.done)} of {count} trips came back"


def _dispatcher(threads, post):
    failures = types.SimpleNamespace(fail_task=lambda *args: None)
    return Dispatcher([CompressionStages()], lambda trip: None, failures, post, pool_threads=threads)


def _run(stage, trips, threads):
    """Each trip's ``stage`` through a dispatcher with ``threads`` codec threads (0: at once, on this thread)."""
    collect = _Collect()
    dispatcher = _dispatcher(threads, collect)
    for trip in trips:
        outcome = getattr(CompressionStages, stage.value)(trip)
        assert isinstance(outcome, OffThread)
        if threads:
            dispatcher.settle(trip, outcome)
        else:
            outcome.work()
    if threads:
        collect.wait(len(trips))
    dispatcher.close()
    return collect


def _round(threads, seed):
    """Compress every partition, then decompress each payload; the payloads, the output, the hand-backs."""
    task = _task(seed)
    trips = _trips(task)
    first = _run(Stage.COMPRESS, trips, threads)
    payloads = [bytes(np.asarray(trip.data, np.uint8)) for trip in trips]
    for trip in trips:
        trip.position = trip.stages.index(Stage.DECOMPRESS)
        # the server's answer has the codec's bytes of a push (the push adds the lr after them)
        trip.data = trip.data[:task.compression.partition(trip.part.index, trip.part.nbytes).codec.nbytes]
    second = _run(Stage.DECOMPRESS, trips, threads)
    return payloads, bytes(task.output.data), (first, second), trips


def test_a_pool_gives_every_partition_the_bytes_of_the_inline_stages():
    base_payloads, base_output, _, _ = _round(0, seed=3)
    payloads, output, collects, trips = _round(2, seed=3)
    assert payloads == base_payloads
    assert output == base_output and any(output)
    for collect in collects:
        assert sorted(id(done.trip) for done in collect.done) == sorted(id(t) for t in trips)
        assert all(isinstance(done, StageDone) and done.error is None for done in collect.done)
        assert collect.threads and all(name.startswith("byteps-compress") for name in collect.threads)


def test_a_codec_that_raises_fails_its_trip_and_the_pool_goes_on():
    task = _task(5)
    trips = _trips(task)
    collect = _Collect()
    dispatcher = _dispatcher(2, collect)
    for trip in trips:
        dispatcher.settle(trip, CompressionStages.compress(trip))
    collect.wait(len(trips))
    assert all(done.error is None for done in collect.done)
    bad, good = trips[0], trips[1]
    for trip in (bad, good):
        trip.position = trip.stages.index(Stage.DECOMPRESS)
        trip.data = trip.data[:task.compression.partition(trip.part.index, trip.part.nbytes).codec.nbytes]
    bad.data = bad.data[:3]  # a truncated answer: the codec refuses it
    dispatcher.settle(bad, CompressionStages.decompress(bad))
    dispatcher.settle(good, CompressionStages.decompress(good))
    collect.wait(len(trips) + 2)
    errors = {id(done.trip): done.error for done in collect.done[len(trips):]}
    assert isinstance(errors[id(bad)], ValueError) and "src has 3 bytes" in str(errors[id(bad)])
    assert errors[id(good)] is None
    dispatcher.close()


def test_pooled_work_comes_back_through_the_queue_and_never_moves_the_trip_itself():
    task = _task(7)
    trip = _trips(task)[0]
    collect = _Collect()
    dispatcher = _dispatcher(2, collect)
    position = trip.position
    dispatcher.settle(trip, CompressionStages.compress(trip))
    collect.wait(1)
    assert trip.position == position  # still at COMPRESS: only the communication thread moves it on
    assert collect.done[0].trip is trip
    dispatcher.close()
