"""The one place that moves a partition from stage to stage, and drops a failed task's partitions.

The :class:`Dispatcher` holds every stage owner's runners. ``advance(trip)``
says the trip's current stage is finished: it starts the next stages in
turn for as long as they finish at once, and stops at the first that waits
(see :mod:`byteps.common.engine.stage` for what a runner answers). When the
last stage is done the task table counts the trip as arrived. A trip whose
task has failed goes nowhere: late events of a failed push_pull are dropped
here.

Work that may leave the communication thread comes back through the
engine's queue as a :class:`StageDone`: a codec run on the pool of
BYTEPS_THREADPOOL_SIZE threads, or GPU work the copy waiter saw finish.

With a tracer, every stage of a traced round becomes a span from the moment
it started to the moment it finished; EXCHANGE is two, as in BytePS's
timeline: "push" until the push went (acknowledged, unpipelined) and
"pull" until the sum came back.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterable, Optional

from byteps.common.engine.route import Stage
from byteps.common.engine.stage import DONE, WAIT, GpuEvent, OffThread, Outcome, StageOwner, TaskFailed
from byteps.common.engine.task import PartitionTrip

__all__ = ["Dispatcher", "StageDone"]


@dataclasses.dataclass(frozen=True)
class StageDone:
    """A trip's stage finished off the communication thread (``error``: it failed there)."""

    trip: PartitionTrip
    error: Optional[BaseException] = None


class Dispatcher:
    """Runs the stages of every trip. ``arrived(trip)``: a trip's route is done; ``post(item)``: puts an item
    on the engine's queue from another thread; ``failures``: the engine's failure fan-out; ``tasks``: the
    engine's task table."""

    def __init__(self, owners: Iterable[StageOwner], arrived: Callable[[PartitionTrip], None], failures: Any,
                 post: Callable[[Any], None], pool_threads: int = 0, tracer: Any = None, tasks: Any = None) -> None:
        self._runners: Dict[Stage, Callable[[PartitionTrip], Outcome]] = {}
        for owner in owners:
            for stage, runner in owner.runners().items():
                if stage in self._runners:
                    raise ValueError(f"stage {stage.name} has a runner already")
                self._runners[stage] = runner
        self._arrived = arrived
        self.failures = failures
        self.tasks = tasks  # the engine's TaskTable: a stand-in task (a joined local root's) joins it here
        self._post = post
        self._pool = ThreadPoolExecutor(pool_threads, thread_name_prefix="byteps-compress") if pool_threads else None
        self._tracer = tracer

    def set_tracer(self, tracer: Any) -> None:
        self._tracer = tracer

    def advance(self, trip: PartitionTrip) -> None:
        """``trip``'s current stage is finished (or it has not started): run the next ones."""
        task = trip.task
        stages, runners = trip.stages, self._runners
        while not task.failed:
            if self._tracer is not None and self._tracer.traces(task.round):
                self._trace(trip)
            position = trip.position = trip.position + 1
            if position == len(stages):
                self._arrived(trip)
                return
            try:
                outcome = runners[stages[position]](trip)
            except TaskFailed as failed:
                self.failures.fail_task(task, failed.error, failed.tell_peers)
                return
            if outcome is DONE:
                continue
            if outcome is WAIT:
                return
            if outcome.__class__ is OffThread and self._pool is None:
                outcome.work()
                continue
            self._await(trip, outcome)
            return

    def settle(self, trip: PartitionTrip, outcome: Outcome) -> None:
        """``trip``'s current stage, started by a message, finishes as ``outcome`` says."""
        if trip.task.failed or outcome is WAIT:
            return
        if outcome is DONE or outcome.__class__ is OffThread and self._pool is None:
            if outcome is not DONE:
                outcome.work()
            self.advance(trip)
            return
        self._await(trip, outcome)

    def handle(self, events: Iterable[Any]) -> None:
        """Events of an owner's receive(): a trip whose stage is finished, or one that delivers itself."""
        for event in events:
            if event.__class__ is PartitionTrip:
                self.advance(event)
            else:
                event.deliver(self)

    def finished_elsewhere(self, done: StageDone) -> None:
        """A stage that ran off this thread came back."""
        if done.trip.task.failed:
            return
        if done.error is not None:
            self.failures.fail_task(done.trip.task, done.error)
            return
        self.advance(done.trip)

    def _await(self, trip: PartitionTrip, outcome: Outcome) -> None:
        post = self._post
        if isinstance(outcome, GpuEvent):
            trip.task.device.staging.waiter.put(
                (outcome.event, trip, (), lambda _staged, _indices, error: post(StageDone(trip, error))))
            return
        work = outcome.work

        def on_pool() -> None:
            try:
                work()
            except BaseException as exc:  # the trip's task fails, not the pool
                post(StageDone(trip, exc))
                return
            post(StageDone(trip))

        self._pool.submit(on_pool)

    def close(self) -> None:
        """Wait for the codecs still running on the pool; no more are taken."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _trace(self, trip: PartitionTrip) -> None:
        now = time.time()
        if trip.position >= 0:
            task, part = trip.task, trip.part
            stage = trip.stages[trip.position]
            span = self._tracer.span
            fields = dict(key=part.key, partition=part.index, step=task.round + 1)
            if stage is not Stage.EXCHANGE:
                span(stage.value, task.name, trip.stage_started, now, **fields)
            elif task.skipped:
                span("pull", task.name, trip.stage_started, now, **fields)
            else:
                sent = trip.sent_at or now
                span("push", task.name, trip.stage_started, sent, **fields)
                span("pull", task.name, sent, now, **fields)
        trip.stage_started = now
