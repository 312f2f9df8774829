"""Worker of the elastic held-table test: a table held by the servers, stepped and committed every step.

Each step every rank looks up its rows of a server-held SGD table (rows
``(7 * step + 3 * rank + k) % 50``, k < 5) and pushes a gradient of
``(rank + 1) * step / 64`` for each; the servers average over the ranks and
step. Every step is committed (the table saved on the servers' machine).
Prints ``joined <epoch> rank R of N at step S`` on (re)entering the loop,
``step S size N`` after each commit, and on rank 0 at the end ``final
<rows>``: rows 0..49 as the servers hold them. ``sys.argv[1]`` steps,
``sys.argv[2]`` seconds of sleep per step.
"""

import json
import sys
import time

import numpy as np

from byteps.common import api
from byteps.common import frontend as front
from byteps.common.elastic import ObjectState, run_fn
from byteps.common.frontend.objects import broadcast_object
from byteps.common.held_table import HeldTable

TABLE, NUM_ROWS, ROW = "emb", 1000, (4,)
HELD = HeldTable("sgd", lr=0.5, seed=7, init_std=0.1)


def step_rows(step: int, rank: int):
    ids = np.array([(7 * step + 3 * rank + k) % 50 for k in range(5)], np.int64)
    return ids, np.full((5, *ROW), (rank + 1) * step / 64, np.float32)


def main() -> None:
    steps, pause = int(sys.argv[1]), float(sys.argv[2])
    front.init()
    state = ObjectState(broadcast_object, front.rank, step=0)

    @run_fn
    def train(state):
        epoch = api.membership_epoch().number if api.membership_epoch() else "-"
        print(f"joined {epoch} rank {front.rank()} of {front.size()} at step {state.step}", flush=True)
        while state.step < steps:
            step = state.step + 1
            ids, grads = step_rows(step, front.rank())
            api.worker().table_lookup(ids, TABLE, NUM_ROWS, ROW, HELD)
            api.worker().table_update_async(ids, grads, TABLE, NUM_ROWS, ROW, HELD).wait()
            state.step = step
            state.commit()
            print(f"step {state.step} size {front.size()}", flush=True)
            time.sleep(pause)

    train(state)
    if front.rank() == 0:
        rows = api.worker().table_lookup(np.arange(50), TABLE, NUM_ROWS, ROW, HELD)
        print("final " + json.dumps(rows.reshape(-1).tolist()), flush=True)
    front.shutdown()


if __name__ == "__main__":
    main()
