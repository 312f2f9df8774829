"""Worker of the ssh teardown test: prints its pid, then push_pulls until killed (60 s at most)."""

import os
import time

import numpy as np

import byteps.common as bps

bps.init()
print(f"PID {bps.rank()} {os.getpid()}", flush=True)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    bps.push_pull(np.ones(1000, np.float32), name="x")
    time.sleep(0.05)
bps.shutdown()
