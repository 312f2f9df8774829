"""Worker of the elastic tests: byteps.common only, numbers a test can replay exactly.

Each step every rank pushes g = (rank + 1) * step (float64, 4096 values) and
adds the average to x; every step is committed. Small integers sum exactly,
so the test can recompute x for any sequence of job sizes. Prints
``joined <epoch> rank R of N at step S x X`` on (re)entering the loop and
``step S size N x X`` after each commit; ``sys.argv[1]`` steps in all,
``sys.argv[2]`` seconds of sleep per step (to give a test time to act).
"""

import sys
import time

import numpy as np

from byteps.common import api
from byteps.common import frontend as front
from byteps.common.elastic import ObjectState, run_fn
from byteps.common.frontend.objects import broadcast_object

steps, pause = int(sys.argv[1]), float(sys.argv[2])
front.init()
state = ObjectState(broadcast_object, front.rank, step=0, x=np.zeros(4096))


@run_fn
def train(state):
    epoch = api.membership_epoch().number if api.membership_epoch() else "-"  # "-": not an elastic job
    print(f"joined {epoch} rank {front.rank()} of {front.size()} at step {state.step} x {state.x[0]:.17g}",
          flush=True)
    while state.step < steps:
        step = state.step + 1
        g = np.full(4096, float((front.rank() + 1) * step))
        api.push_pull(g, name="g", average=True)
        state.x = state.x + g
        state.step = step
        state.commit()
        print(f"step {state.step} size {front.size()} x {state.x[0]:.17g}", flush=True)
        time.sleep(pause)


train(state)
assert np.all(state.x == state.x[0])
print(f"final step {state.step} x {state.x[0]:.17g}", flush=True)
front.shutdown()
