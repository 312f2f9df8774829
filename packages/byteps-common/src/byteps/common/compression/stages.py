"""The COMPRESS and DECOMPRESS stages of a compressed partition's route (see byteps.common.route).

COMPRESS runs on the process that pushes the partition (the local root, or
the only process of its machine), after the local sum: it turns the
partition's dense bytes into the payload (momentum, error feedback, codec,
learning rate; :class:`~byteps.common.compression.feedback.WorkerPartition`)
and remembers where the result must land. DECOMPRESS turns the server's
compressed sum back into dense bytes there: straight into the task's output
when COPY_OUT follows, else into the local root's slot for LOCAL_BROADCAST.
Compressed tensors are averaged before they are compressed (servers only
sum them, as in BytePS), so COPY_OUT does not divide them again.
"""

from __future__ import annotations

from typing import Callable

from byteps.common.route import PartitionTrip, Stage

__all__ = ["CompressionStages"]


class CompressionStages:
    """The two stage handlers; ``proceed`` moves a trip on."""

    def __init__(self, proceed: Callable[[PartitionTrip], None]) -> None:
        self._proceed = proceed

    def compress(self, trip: PartitionTrip) -> None:
        task, part = trip.task, trip.part
        partition = task.compression.partition(part.index, part.nbytes)
        after = trip.route[trip.position + 4] if trip.position + 4 < len(trip.route) else None
        trip.dense = trip.output if after is Stage.COPY_OUT else trip.data
        prescale = 1.0 / task.average_over if task.average_over > 1 else 1.0
        trip.data = partition.compress(trip.data, task.lr, prescale)
        trip.pull_nbytes = partition.pull_nbytes
        self._proceed(trip)

    def decompress(self, trip: PartitionTrip) -> None:
        task, part = trip.task, trip.part
        task.compression.partition(part.index, part.nbytes).decompress(trip.data, trip.dense)
        trip.data = trip.dense
        self._proceed(trip)
