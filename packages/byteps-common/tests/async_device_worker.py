"""Worker of test_async_device.py: asynchronous training (BYTEPS_ENABLE_ASYNC=1) of CUDA parameters.

A stand-in for the GPU (byteps.testkit.device_stand_in) plays CUDA memory,
so the parameters go the real CUDA way: pinned staging partition by
partition, the servers' store, the copies back. Rank 0's initial values
become the store; each step every rank subtracts its own delta and
exchanges; after a barrier and one more exchange of nothing, every rank
holds the initial values minus every rank's every delta, applied once.
Prints ``ASYNC DEVICE OK rank R``.
"""

from __future__ import annotations

import sys

import numpy as np

import byteps.common as bps
from byteps.common.frontend.async_training import ParameterExchange, Snapshots
from byteps.testkit import device_stand_in
from byteps.testkit.device_stand_in import StandInCudaTensor

STEPS, COUNT = 6, 50_000  # several partitions of 16 KB


def _host(tensor):
    return tensor.host_array


SNAPSHOTS = Snapshots(copy=lambda t: StandInCudaTensor(_host(t).copy()),
                      subtract=lambda a, b: StandInCudaTensor(_host(a) - _host(b)),
                      zeros_like=lambda t: StandInCudaTensor(np.zeros_like(_host(t))))


def delta(rank: int, step: int) -> float:
    return 0.25 * (rank + 1) + step  # exactly representable: the sums are exact


def main() -> None:
    device_stand_in.install(delay_s=0.0005)
    bps.init()
    rank, size = bps.rank(), bps.size()
    initial = np.arange(COUNT, dtype=np.float64) if rank == 0 else np.full(COUNT, -1.0)
    parameters = {"w": StandInCudaTensor(initial.copy())}
    exchange = ParameterExchange(["w"], SNAPSHOTS)
    exchange.start(parameters)
    assert np.array_equal(_host(parameters["w"]), np.arange(COUNT, dtype=np.float64)), "rank 0's values first"
    for step in range(STEPS):
        before = exchange.snapshot(parameters)
        _host(parameters["w"])[:] -= delta(rank, step)  # the local optimizer's step
        exchange.exchange(before, parameters)
    bps.barrier()  # every rank's pushes were applied before its last pull was answered
    exchange.exchange(exchange.snapshot(parameters), parameters)  # a delta of zeros: read the store
    applied = sum(delta(r, s) for r in range(size) for s in range(STEPS))
    want = np.arange(COUNT, dtype=np.float64) - applied
    got = _host(parameters["w"])
    assert np.array_equal(got, want), (got[:3], want[:3])
    print(f"ASYNC DEVICE OK rank {rank}", flush=True)
    bps.shutdown()


if __name__ == "__main__":
    sys.exit(main())
