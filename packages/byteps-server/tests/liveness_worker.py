"""A worker that push_pulls until the job breaks, then prints why and exits 1."""

import sys
import time

import numpy as np

import byteps.common as bps

bps.init()
print(f"rank {bps.rank()} training", flush=True)
x = np.ones(1000, dtype=np.float32)
try:
    while True:
        bps.push_pull(x, name="grad", average=True)
        time.sleep(0.01)
except Exception as exc:  # the point: a clear error, not a hang
    print(f"rank {bps.rank()} stopped: {exc}", flush=True)
    sys.exit(1)
