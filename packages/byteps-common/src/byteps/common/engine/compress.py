"""The COMPRESS and DECOMPRESS stages of a compressed partition's route.

COMPRESS runs on the process that pushes the partition (the local root, or
the only process of its machine), after the local sum: it turns the
partition's dense bytes into the payload (momentum, error feedback, codec,
learning rate; :class:`~byteps.common.compression.feedback.WorkerPartition`)
and remembers where the result must land (the route's
:class:`~byteps.common.engine.route.Landing`: the task's output, or the
local root's slot). DECOMPRESS turns the server's compressed sum back into
dense bytes there. Compressed tensors are averaged before they are
compressed (servers only sum them, as in BytePS), so COPY_OUT does not
divide them again.

Both answer :class:`~byteps.common.engine.stage.OffThread`: with
BYTEPS_THREADPOOL_SIZE (BytePS's name) the dispatcher runs the codecs on a
pool of that many threads, several partitions at once (the kernels release
the GIL); without, at once. A partition's state is only ever touched by one
round at a time, since a tensor's next round starts after its last one
ended.
"""

from __future__ import annotations

from byteps.common.engine.route import Landing, Stage
from byteps.common.engine.stage import OffThread
from byteps.common.engine.task import PartitionTrip

__all__ = ["CompressionStages"]


class CompressionStages:
    """The two stage runners."""

    def runners(self):
        return {Stage.COMPRESS: self.compress, Stage.DECOMPRESS: self.decompress}

    @staticmethod
    def compress(trip: PartitionTrip) -> OffThread:
        task, part = trip.task, trip.part
        partition = task.compression.partition(part.index, part.nbytes)
        trip.dense = trip.output if trip.route.landing is Landing.OUTPUT else trip.data
        prescale = 1.0 / task.average_over if task.average_over > 1 else 1.0
        trip.pull_nbytes = partition.pull_nbytes
        data, lr = trip.data, task.lr

        def codec() -> None:
            trip.data = partition.compress(data, lr, prescale)

        return OffThread(codec)

    @staticmethod
    def decompress(trip: PartitionTrip) -> OffThread:
        task, part = trip.task, trip.part
        partition = task.compression.partition(part.index, part.nbytes)
        compressed = trip.data

        def codec() -> None:
            partition.decompress(compressed, trip.dense)
            trip.data = trip.dense

        return OffThread(codec)
