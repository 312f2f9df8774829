"""Worker that gathers and broadcasts one tensor and reports the network bytes its process sent and received.

Usage: python gather_bytes_worker.py COUNT
Prints ``GATHER <worker id> sent <n> received <n> buffer <n>``, ``BROADCAST <worker id> sent <n>
received <n>`` and ``SCATTER <worker id> sent <n> received <n>`` after checking the results: only this
rank's bytes of a gather should go out and only the others' come back; a broadcast's root sends its tensor
and receives none of it, the others the reverse; an averaging reducescatter of 2 x COUNT float32 sends
all of it and receives only this rank's rows. With local peers it also prints ``LOCAL GATHER <rank>
copied <n> summed <n> out <n>`` and ``LOCAL BROADCAST ...``: the bytes this rank copied into shared
memory, the slots it added into sums as a root and the bytes it copied into its outputs (a gather's
describe table, summed whole, included).
"""

from __future__ import annotations

import os
import sys

import numpy as np

import byteps.common as bps
from byteps.common.api import worker
from byteps.common.dtypes import DType
from byteps.common.frontend import collectives as front
from byteps.common.options import PushPullOptions


def main() -> None:
    count = int(sys.argv[1])
    bps.init()
    rank, size = bps.rank(), bps.size()
    me = os.environ["DMLC_WORKER_ID"]
    mine = np.arange(count, dtype=np.float32) + 1000 * rank
    engine = worker()._comm.engine  # with local peers: what this rank copied into shared memory, summed, copied out

    def local_counts() -> tuple:
        local = engine.local
        return (local.copied_in, local.sums, engine.copy_out.copied_out) if local is not None else (0, 0, 0)

    before, before_received = worker().bytes_sent, worker().bytes_received
    counted = local_counts()
    started = front.allgather("gathered", front.Piece(mine.view(np.uint8), (count,), "float32"))
    started.core.wait()
    gathered = started.finish()
    sent, received = worker().bytes_sent - before, worker().bytes_received - before_received
    got = np.asarray(gathered.data).view(np.float32)
    want = np.concatenate([np.arange(count, dtype=np.float32) + 1000 * r for r in range(size)])
    assert np.array_equal(got, want), (got[:3], want[:3])
    assert not gathered.data.flags.owndata, "float32 parts lie end to end: the result is a view, not a copy"
    buffer = 1 << (size * count - 1).bit_length()  # the move buffer's int32 words, a power of two
    print(f"GATHER {me} sent {sent} received {received} buffer {buffer * 4}", flush=True)
    copied, summed, out = (now - then for now, then in zip(local_counts(), counted))
    print(f"LOCAL GATHER {rank} copied {copied} summed {summed} out {out}", flush=True)

    before, before_received = worker().bytes_sent, worker().bytes_received
    counted = local_counts()
    x = mine.copy() if rank == 0 else np.zeros(count, np.float32)
    worker().push_pull_async(x, "broadcast", PushPullOptions(average=False, root=0)).wait()
    assert np.array_equal(x, np.arange(count, dtype=np.float32)), x[:3]
    print(f"BROADCAST {me} sent {worker().bytes_sent - before} received "
          f"{worker().bytes_received - before_received}", flush=True)
    copied, summed, out = (now - then for now, then in zip(local_counts(), counted))
    print(f"LOCAL BROADCAST {rank} copied {copied} summed {summed} out {out}", flush=True)

    before, before_received = worker().bytes_sent, worker().bytes_received
    rows = np.arange(2 * count, dtype=np.float32)
    started = front.reducescatter("scattered", rows + rank, DType.FLOAT32, average=True)
    started.core.wait()
    first, mine = front.split_rows(2 * count, size, rank)
    want = rows[first:first + mine] + np.float32((size - 1) / 2)  # the mean of rows + r over the ranks
    got = started.finish()
    assert np.array_equal(got, want), (got[:3], want[:3])
    print(f"SCATTER {me} sent {worker().bytes_sent - before} received "
          f"{worker().bytes_received - before_received}", flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
