"""The dispatcher: the one place that moves a trip on, and drops a failed task's trips.

Stage runners here are plain functions that record what they saw and
answer as a stage would (the real owners have their own tests in
test_engine_stages.py); the point is what the dispatcher does with each
answer.
"""

from __future__ import annotations

import types

import numpy as np

from byteps.common.buffers import input_and_output_views
from byteps.common.engine.dispatcher import Dispatcher, StageDone
from byteps.common.engine.route import Role, Stage, plan_route
from byteps.common.engine.stage import DONE, WAIT, Later, OffThread, TaskFailed
from byteps.common.engine.task import PartitionTrip, PushPullTask
from byteps.common.handle import Handle
from byteps.common.partition import PartitionPlan


class Owner:
    """Answers each stage as ``answers`` says (default DONE) and records the order it ran them in."""

    def __init__(self, answers=None):
        self.answers, self.ran = answers or {}, []

    def runners(self):
        return {stage: self._runner(stage) for stage in Stage}

    def _runner(self, stage):
        def run(trip):
            self.ran.append(stage)
            answer = self.answers.get(stage, DONE)
            if isinstance(answer, Exception):
                raise answer
            return answer
        return run


class Failures:
    def __init__(self):
        self.failed = []

    def fail_task(self, task, error, tell_peers=True, tell_servers=True):
        task.failed = True
        self.failed.append((task, error, tell_peers))


def make(owner, threads=0):
    arrived, posted, failures = [], [], Failures()
    dispatcher = Dispatcher([owner], arrived.append, failures, posted.append, pool_threads=threads)
    return dispatcher, arrived, posted, failures


def a_trip(role=Role.ROOT):
    source, output = input_and_output_views(np.ones(4, np.float32), None, "t", None)
    task = PushPullTask("t", 0, source, output, PartitionPlan.build(1, 16, 4, 16, 1), Handle("t", None))
    return PartitionTrip(task, task.plan.partitions[0], plan_route(role, True))


def test_stages_that_finish_at_once_run_in_one_go_to_arrival():
    owner = Owner()
    dispatcher, arrived, _, _ = make(owner)
    trip = a_trip()
    dispatcher.advance(trip)
    assert owner.ran == list(trip.stages) and arrived == [trip]


def test_a_waiting_stage_stops_the_trip_until_its_event_moves_it_on():
    owner = Owner({Stage.EXCHANGE: WAIT})
    dispatcher, arrived, _, _ = make(owner)
    trip = a_trip()
    dispatcher.advance(trip)
    assert owner.ran == [Stage.LOCAL_REDUCE, Stage.EXCHANGE] and not arrived and trip.stage is Stage.EXCHANGE
    dispatcher.handle([trip])  # the server's answer came
    assert owner.ran[-2:] == [Stage.LOCAL_BROADCAST, Stage.COPY_OUT] and arrived == [trip]


def test_a_stage_that_raises_fails_its_task_and_nothing_runs_after_it():
    owner = Owner({Stage.LOCAL_REDUCE: TaskFailed(ValueError("local ranks disagree"), tell_peers=True)})
    dispatcher, arrived, _, failures = make(owner)
    trip = a_trip()
    dispatcher.advance(trip)
    assert owner.ran == [Stage.LOCAL_REDUCE] and not arrived
    (task, error, tell_peers), = failures.failed
    assert task is trip.task and "disagree" in str(error) and tell_peers


def test_late_events_of_a_failed_task_are_dropped_here():
    owner = Owner({Stage.EXCHANGE: WAIT})
    dispatcher, arrived, _, _ = make(owner)
    trip = a_trip()
    dispatcher.advance(trip)
    trip.task.failed = True
    ran = len(owner.ran)
    dispatcher.handle([trip, Later(trip, DONE)])
    dispatcher.finished_elsewhere(StageDone(trip))
    assert len(owner.ran) == ran and not arrived


def test_off_thread_work_runs_at_once_without_a_pool_and_comes_back_through_the_queue_with_one():
    done = []
    owner = Owner({Stage.EXCHANGE: OffThread(lambda: done.append("codec"))})
    dispatcher, arrived, posted, _ = make(owner)
    trip = a_trip()
    dispatcher.advance(trip)
    assert done == ["codec"] and arrived == [trip] and not posted

    dispatcher, arrived, posted, _ = make(owner, threads=1)
    trip = a_trip()
    dispatcher.advance(trip)
    dispatcher.close()  # waits for the pool
    assert done == ["codec", "codec"] and not arrived and [item.trip for item in posted] == [trip]
    dispatcher.finished_elsewhere(posted[0])
    assert arrived == [trip]


def test_gpu_work_is_handed_to_the_copy_waiter_and_comes_back_through_the_queue():
    from byteps.common.engine.stage import GpuEvent

    waiter = []
    owner = Owner({Stage.LOCAL_REDUCE: GpuEvent("event-1")})
    dispatcher, arrived, posted, _ = make(owner)
    trip = a_trip()
    trip.task.device = types.SimpleNamespace(staging=types.SimpleNamespace(waiter=types.SimpleNamespace(
        put=waiter.append)))
    dispatcher.advance(trip)
    (event, waited, indices, report), = waiter
    assert (event, waited, indices) == ("event-1", trip, ()) and not arrived
    report(None, (), None)  # the copy waiter saw the GPU pass the event
    assert [item.trip for item in posted] == [trip] and posted[0].error is None
