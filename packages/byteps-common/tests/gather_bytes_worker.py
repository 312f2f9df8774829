"""Worker that gathers and broadcasts one tensor and reports the network bytes its process sent for each.

Usage: python gather_bytes_worker.py COUNT
Prints ``GATHER <worker id> sent <n> buffer <n>`` and ``BROADCAST <worker id> sent <n>`` after checking
the results: only this rank's bytes of a gather (and none of a broadcast it does not root) should travel.
"""

from __future__ import annotations

import os
import sys

import numpy as np

import byteps.common as bps
from byteps.common.api import worker
from byteps.common.frontend import collectives as front


def main() -> None:
    count = int(sys.argv[1])
    bps.init()
    rank, size = bps.rank(), bps.size()
    me = os.environ["DMLC_WORKER_ID"]
    mine = np.arange(count, dtype=np.float32) + 1000 * rank
    before = worker().bytes_sent
    started = front.allgather("gathered", front.Piece(mine.view(np.uint8), (count,), "float32"))
    started.core.wait()
    gathered = started.finish()
    sent = worker().bytes_sent - before
    got = np.asarray(gathered.data).view(np.float32)
    want = np.concatenate([np.arange(count, dtype=np.float32) + 1000 * r for r in range(size)])
    assert np.array_equal(got, want), (got[:3], want[:3])
    buffer = 1 << (size * count - 1).bit_length()  # the move buffer's int32 words, a power of two
    print(f"GATHER {me} sent {sent} buffer {buffer * 4}", flush=True)

    before = worker().bytes_sent
    x = mine.copy() if rank == 0 else np.zeros(count, np.float32)
    worker().push_pull_async(x, "broadcast", average=False, root=0).wait()
    assert np.array_equal(x, np.arange(count, dtype=np.float32)), x[:3]
    print(f"BROADCAST {me} sent {worker().bytes_sent - before}", flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
