"""The COPY_OUT stage: a partition's result into the task's output, divided when averaging.

Nothing is copied where the sum landed in the output already, or where the
caller said the output holds the result (``keep_output``: a gather's own
rows, a broadcast root's tensor) or a pull was bare. A compressed tensor was
averaged before it was pushed, so it is not divided again.
"""

from __future__ import annotations

from byteps.common import kernels
from byteps.common.engine.route import Stage
from byteps.common.engine.stage import DONE, Outcome
from byteps.common.engine.task import PartitionTrip

__all__ = ["CopyOut"]


class CopyOut:
    """The COPY_OUT runner, and how many bytes it wrote."""

    def __init__(self) -> None:
        self.copied_out = 0  # bytes COPY_OUT wrote into outputs (not those that landed there or were kept)

    def runners(self):
        return {Stage.COPY_OUT: self.copy_out}

    def copy_out(self, trip: PartitionTrip) -> Outcome:
        target, task = trip.output, trip.task
        if task.keep_output and trip.part.inside(task.keep_output):
            return DONE  # e.g. a gather's own rows, summed with local peers' zeros
        # A bare pull's data is the output itself; a compressed tensor was averaged before it was pushed.
        if task.average_over > 1 and task.compression is None and trip.pull_nbytes:
            kernels.scale_into(target, trip.data, task.output.dtype, task.average_over)
            self.copied_out += trip.part.nbytes
        elif trip.data is not target:
            target[:] = trip.data
            self.copied_out += trip.part.nbytes
        return DONE
