"""Worker of the SLURM failure test: rank 1 fails after the job assembled, the others keep push_pulling."""

import sys
import time

import numpy as np

import byteps.common as bps

bps.init()
bps.push_pull(np.ones(10, np.float32), name="x")
if bps.rank() == 1:
    sys.exit(3)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    bps.push_pull(np.ones(10, np.float32), name="x")
    time.sleep(0.05)
