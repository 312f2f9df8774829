"""The push_pulls in flight: started, counted down partition by partition, completed.

A task's handle completes when its last trip arrives (its route is done).
A stand-in task (a joined local root summing for its peers) has no caller:
it just leaves the table. ``idle`` is asked about after every task that
leaves, so that a join waiting for this worker's own tasks can start.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Optional, Sequence

from byteps.common.engine.task import PartitionTrip, PushPullTask

__all__ = ["TaskTable"]


class TaskTable:
    """Tasks started and not finished; ``tracer`` records a "tensor" span per traced task."""

    def __init__(self, tracer: Any = None) -> None:
        self.tracer = tracer
        self.active: Dict[PushPullTask, None] = {}  # insertion-ordered set
        self.idle: Optional[Callable[[], None]] = None  # called after a task leaves (the join's check)

    def __len__(self) -> int:
        return len(self.active)

    def add(self, task: PushPullTask, trips: Sequence[PartitionTrip]) -> None:
        task.remaining = len(trips)
        task.network_partitions = sum(trip.route.servers for trip in trips)
        if self.tracer is not None and self.tracer.traces(task.round):
            task.started = time.time()
        self.active[task] = None

    def arrived(self, trip: PartitionTrip) -> None:
        task = trip.task
        task.remaining -= 1
        if task.remaining:
            return
        self.active.pop(task, None)
        if task.started and self.tracer is not None:
            self.tracer.span("tensor", task.name, task.started, time.time(), step=task.round + 1,
                             partitions=len(task.plan.partitions), nbytes=task.plan.nbytes)
        if not task.stand_in:
            task.handle.rounds_closed_after = task.closed_after
            task.handle.set_done()
        if self.idle is not None:
            self.idle()

    def remove(self, task: PushPullTask) -> bool:
        """Take a failing task out; False if it had finished or failed already."""
        if task not in self.active:
            return False
        del self.active[task]
        task.remaining = -1  # nothing more completes it
        task.failed = True
        return True
