"""Worker that reports the network bytes its process moved for R rounds of one tensor.

Usage: python bytes_worker.py ROUNDS COUNT
Prints ``BYTES machine <worker id> sent <n> received <n>`` after checking the sums.
"""

from __future__ import annotations

import os
import sys

import numpy as np

import byteps.common as bps
from byteps.common.api import worker


def main() -> None:
    rounds, count = int(sys.argv[1]), int(sys.argv[2])
    bps.init()
    rank, size = bps.rank(), bps.size()
    for round_ in range(rounds):
        x = np.full(count, float(rank + round_), np.float32)
        bps.push_pull(x, name="gradient", average=False)
        expected = sum(r + round_ for r in range(size))
        assert np.all(x == expected), (round_, x[:3], expected)
    w = worker()
    print(f"BYTES machine {os.environ['DMLC_WORKER_ID']} sent {w.bytes_sent} received {w.bytes_received}",
          flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
