"""A worker of the local-stranger test: rank 0 (the partition's root) sums late.

Rank 1 writes its input, then waits for the root's LOCAL_DONE while the
test, as a stranger on the host, sends it a forged one. Each rank prints
what it got; the test checks that it is the true sum.
"""

import os
import time

import numpy as np

import byteps.common as bps

bps.init()
if bps.local_rank() == 0:
    # Hold the real LOCAL_DONE back until the stranger's forgery has arrived.
    while not os.path.exists(os.environ["STRANGER_DONE_FILE"]):
        time.sleep(0.05)
grad = np.full(1000, bps.rank() + 1, dtype=np.float32)
bps.push_pull(grad, name="grad", average=False)
print(f"rank {bps.rank()} result min {grad.min():g} max {grad.max():g}", flush=True)
bps.shutdown()
