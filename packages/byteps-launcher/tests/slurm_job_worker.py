"""Worker of the two-node SLURM tests: one push_pull of (rank + 1); prints where it ran and what it summed."""

import os

import numpy as np

import byteps.common as bps

bps.init()
total = bps.push_pull(np.full(4, bps.rank() + 1, np.float32), name="x", average=False)
print(f"RAN rank {bps.rank()} of {bps.size()} on {os.environ.get('SLURMD_NODENAME')} machine "
      f"{os.environ['DMLC_WORKER_ID']} local {bps.local_rank()} of {bps.local_size()} "
      f"scheduler {os.environ['DMLC_PS_ROOT_URI']} sum {float(total[0]):g}", flush=True)
bps.shutdown()
