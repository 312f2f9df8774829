"""Worker of the priority test: queues tensors in reverse declaration order while the server is stopped.

Usage: python priority_worker.py FLAG_FILE [COUNT]
Declares t0..t5 (t0 first), warms up, prints READY and waits for FLAG_FILE
(the test stops the server meanwhile); then push_pulls t5 and, behind it,
t4 ... t0, and checks the sums.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import byteps.common as bps

COUNT = 16384  # 64 KiB of float32: one partition each (a second argument sets another count)


def main() -> None:
    flag = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else COUNT
    bps.init()
    names = [f"t{i}" for i in range(6)]
    for name in names:
        bps.declare(name)
    for name in names:  # warm-up: every key initialized, every connection up
        bps.push_pull(np.ones(count, np.float32), name=name, average=False)
    print("READY", flush=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(flag):
        if time.monotonic() > deadline:
            sys.exit("no go-ahead from the test")
        time.sleep(0.01)
    tensors = {name: np.full(count, float(i + 1), np.float32) for i, name in enumerate(names)}
    handles = [bps.push_pull_async(tensors[name], name=name, average=False) for name in reversed(names)]
    print("SUBMITTED", flush=True)
    for handle in handles:
        bps.synchronize(handle)
    for i, name in enumerate(names):
        assert np.all(tensors[name] == (i + 1) * bps.size()), name
    print("priority worker OK", flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
