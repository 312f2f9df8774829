"""Type stub for byteps.server._C, the parameter server's summation engine."""

from typing import Dict

from typing_extensions import Buffer

KERNEL_ABI: int
PARALLEL_BYTES: int
"""Pushes of at least this many bytes are split over the thread pool."""

class ServerEngine:
    """Per-key accumulation store and persistent thread pool.

    Each key keeps its last two rounds' results by round parity: round r's
    result stays readable until release(key, r) or the first push of round
    r + 2, whichever comes first. Sums are written into buffers from a pool
    shared by every key; a buffer returns to it only once the engine let go
    of its result and no view of it is left, so a view never sees new bytes.

    Pushes are not copied: the engine holds a reference to a round's first
    push and sums it with the second in one pass; with num_workers == 1 the
    push itself is the round's result (result() is a view onto it, kept
    until the round is released or round r + 2 starts). So a pushed buffer
    must not be modified until its round completes, nor, with one worker,
    while its result is in use.
    The caller may drop its own reference at once (a zmq.Frame stays alive).
    """

    def __init__(self, num_threads: int, num_workers: int, kernel_table: Dict[str, int]) -> None:
        """num_threads >= 1 counts the calling thread; kernel_table is
        byteps.common._C.kernel_table() (ValueError on an ABI mismatch)."""
    @property
    def num_threads(self) -> int: ...
    @property
    def num_workers(self) -> int: ...
    @property
    def sum_bytes(self) -> int:
        """Bytes of sum buffers allocated so far (the pool's size): about the rounds in
        flight at once, not the keys' total. Halves' float32 accumulators count too."""
    def declare(self, key: int, nbytes: int, dtype: int, contributors: int = 0) -> None:
        """Declare a key (its sum buffers come from the pool as rounds are summed); idempotent for the
        same (nbytes, dtype, contributors).

        ``contributors`` pushes complete a round (0: num_workers; fewer for a process set's keys)."""
    def push(self, key: int, round: int, data: Buffer, zeros: bool = False) -> bool:
        """Sum one worker's push into `round` (the round the key is accumulating);
        True when it was the num_workers-th push and the round is finalized.
        The engine may keep a reference to data (see the class docstring).
        zeros=True: data is all zeros and is only counted; a round whose pushes
        but one are zeros has that push as its sum (held, not copied), and a
        round of zeros alone has data."""
    def result(self, key: int, round: int) -> memoryview:
        """Read-only memoryview ('B', nbytes) of a completed round's sum (with one
        worker, of the pushed buffer itself); it keeps the bytes alive, even
        past the engine. ValueError if the round is not completed, was
        released, or round + 2 has started."""
    def release(self, key: int, round: int) -> None:
        """Drop a completed round's result now, once every worker has it; its
        buffer returns to the pool when no view of it is left. A round the
        engine does not hold is ignored."""
    def completed_round(self, key: int) -> int:
        """The key's last completed round, -1 before the first."""
    def reduce_into(self, dst: Buffer, src: Buffer, dtype: int) -> None:
        """dst += src in dtype, split over the pool (halves through float32)."""
