"""Worker of the elastic asynchronous-training test: byteps.common's ParameterExchange across membership epochs.

Run with BYTEPS_ENABLE_ASYNC=1 under bpslaunch --min-np. Two parameters,
``a`` (4096 float64) and ``b`` (2 float64), begin as worker w0's values
(``a`` = 7, ``b`` = 0; any other worker's differ, so a store that did not
begin from rank 0 shows). At step S the worker named wN changes them by

    a += (N + 1) * 100 + S        b += (1, N + 1)

pushes that change and takes the servers' parameters (no averaging), then
commits. Small integers sum exactly in any order, so the committed values
are a replay's: the initial ones plus every delta of every step so far,
each once (``b[0]`` counts the deltas). Prints ``joined <epoch> rank R of N
members <names> at step S a A`` on (re)entering the loop and ``step S size
N a A b B0 B1`` after each commit; ``sys.argv[1]`` steps in all,
``sys.argv[2]`` seconds of sleep per step.
"""

import os
import sys
import time

import numpy as np

from byteps.common import api
from byteps.common import frontend as front
from byteps.common.elastic import ObjectState, run_fn
from byteps.common.frontend.async_training import ParameterExchange, Snapshots
from byteps.common.frontend.objects import broadcast_object

steps, pause = int(sys.argv[1]), float(sys.argv[2])
number = int(os.environ["BYTEPS_ELASTIC_WORKER"][1:])
front.init()
initial = {"a": np.full(4096, 7.0 + 1000 * number), "b": np.full(2, float(number))}
state = ObjectState(broadcast_object, front.rank, step=0, params=initial)
# restore() and sync() give state.params new arrays: the commit takes the store into those in place now.
exchange = ParameterExchange(["a", "b"], Snapshots(copy=np.copy, subtract=np.subtract, zeros_like=np.zeros_like),
                             at_commit=lambda: exchange.pull(state.params))


@run_fn
def train(state):
    members = ",".join(api.membership_epoch().members)
    print(f"joined {api.membership_epoch().number} rank {front.rank()} of {front.size()} members {members} "
          f"at step {state.step} a {state.params['a'][0]:.17g}", flush=True)
    while state.step < steps:
        step = state.step + 1
        params = state.params
        exchange.start(params)  # the first step of each epoch: its empty store becomes rank 0's parameters
        before = exchange.snapshot(params)
        params["a"] += (number + 1) * 100 + step
        params["b"] += (1.0, number + 1.0)
        exchange.exchange(before, params)
        state.step = step
        state.commit()
        a, b = state.params["a"], state.params["b"]
        assert np.all(a == a[0])
        print(f"step {step} size {front.size()} a {a[0]:.17g} b {b[0]:.17g} {b[1]:.17g}", flush=True)
        time.sleep(pause)


train(state)
print(f"final step {state.step} a {state.params['a'][0]:.17g} b {state.params['b'][0]:.17g} "
      f"{state.params['b'][1]:.17g}", flush=True)
front.shutdown()
