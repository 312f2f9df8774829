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

With ``threads`` (BYTEPS_THREADPOOL_SIZE, BytePS's name) the codecs run on
a pool of that many threads, several partitions at once (the kernels
release the GIL), and ``finished(trip, error)`` hands each trip back from
the pool thread (to the communication thread, which then moves it on);
without, they run where the stage starts. A partition's state is only
ever touched by one round at a time, since a tensor's next round starts
after its last one ended.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

from byteps.common.route import PartitionTrip, Stage

__all__ = ["CompressionStages"]

#: Hands a trip whose codec ran on a pool thread back, with the error it raised (None: done).
Finished = Callable[[PartitionTrip, Optional[BaseException]], None]


class CompressionStages:
    """The two stage handlers; ``proceed`` moves a trip on."""

    def __init__(self, proceed: Callable[[PartitionTrip], None], threads: int = 0,
                 finished: Optional[Finished] = None) -> None:
        if threads and finished is None:
            raise ValueError("a compression thread pool needs a finished callback")
        self._proceed = proceed
        self._finished = finished
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="byteps-compress") if threads else None

    def compress(self, trip: PartitionTrip) -> None:
        task, part = trip.task, trip.part
        partition = task.compression.partition(part.index, part.nbytes)
        after = trip.route[trip.position + 4] if trip.position + 4 < len(trip.route) else None
        trip.dense = trip.output if after is Stage.COPY_OUT else trip.data
        prescale = 1.0 / task.average_over if task.average_over > 1 else 1.0
        trip.pull_nbytes = partition.pull_nbytes
        data = trip.data

        def codec() -> None:
            trip.data = partition.compress(data, task.lr, prescale)

        self._run(trip, codec)

    def decompress(self, trip: PartitionTrip) -> None:
        task, part = trip.task, trip.part
        partition = task.compression.partition(part.index, part.nbytes)
        compressed = trip.data

        def codec() -> None:
            partition.decompress(compressed, trip.dense)
            trip.data = trip.dense

        self._run(trip, codec)

    def _run(self, trip: PartitionTrip, codec: Callable[[], None]) -> None:
        if self._pool is None:
            codec()
            self._proceed(trip)
            return

        def on_pool() -> None:
            try:
                codec()
            except BaseException as exc:  # the trip's task fails, not the pool
                self._finished(trip, exc)
                return
            self._finished(trip, None)

        self._pool.submit(on_pool)

    def close(self) -> None:
        """Wait for the codecs still running; no more are taken."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
