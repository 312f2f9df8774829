"""Worker whose local rank 1 push_pulls another size (or dtype) than local rank 0 under one name.

Usage: python mismatch_local_worker.py size|dtype
Every rank must fail with an error naming both sides, within seconds.
"""

from __future__ import annotations

import sys

import numpy as np

import byteps.common as bps


def main() -> None:
    what = sys.argv[1]
    bps.init()
    local = bps.local_rank()
    count = 1000 + (local if what == "size" else 0)
    dtype = np.float32 if what == "size" or local == 0 else np.int32
    try:
        bps.push_pull(np.ones(count, dtype), name="w", average=False)
    except Exception as exc:  # noqa: BLE001 - the test reads the message
        print(f"FAILED rank {bps.rank()}: {exc}", flush=True)
        sys.exit(3)
    print("no error", flush=True)


if __name__ == "__main__":
    main()
