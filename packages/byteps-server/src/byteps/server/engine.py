"""The summation engine of a byteps server, wired to byteps-common's kernels.

``ServerEngine`` (compiled, ``byteps.server._C``) keeps every key's
accumulator and its last two rounds' sums and runs pushes on a persistent
thread pool. It copies no push: a round's first push is held (the frame
stays alive) and summed with the second in one pass, and with one worker
the push itself is the result, so a pushed buffer must not change until its
round is done. It sums with the kernels of byteps-common, which it reaches
through the C function pointers of ``byteps.common._C.kernel_table()``;
:func:`create_engine` does that wiring::

    from byteps.common.dtypes import DType
    from byteps.server.engine import create_engine

    engine = create_engine(num_threads=4, num_workers=2)
    engine.declare(key=7, nbytes=4096, dtype=DType.FLOAT16)
    engine.push(7, 0, worker0_frame)            # False: 1 of 2
    if engine.push(7, 0, worker1_frame):        # True: round 0 is summed
        send(engine.result(7, 0))               # read-only memoryview
"""

from __future__ import annotations

from byteps.common import _C as _kernels
from byteps.server._C import ServerEngine

__all__ = ["ServerEngine", "create_engine"]


def create_engine(num_threads: int, num_workers: int) -> ServerEngine:
    """A ServerEngine on ``num_threads`` threads (the caller's included) for ``num_workers`` pushes per round.

    Raises ValueError for a bad thread or worker count, or when the installed
    byteps-common's kernel ABI is not the one this byteps-server was built for.
    """
    return ServerEngine(num_threads, num_workers, _kernels.kernel_table())
