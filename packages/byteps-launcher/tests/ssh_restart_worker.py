"""Worker of the ssh restart test: one push_pull, then rank 1 fails in the job's first attempt (exit 4)."""

import os

import numpy as np

import byteps.common as bps

attempt = int(os.environ["BYTEPS_RESTART_COUNT"])
bps.init()
x = np.ones(1000, np.float32)
bps.push_pull(x, name="x", average=False)
print(f"ATTEMPT {attempt} rank {bps.rank()} host {os.environ['DMLC_NODE_HOST']} sum {x[0]:g}", flush=True)
if attempt == 0 and bps.rank() == 1:
    os._exit(4)
bps.shutdown()
