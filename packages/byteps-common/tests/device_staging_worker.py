"""Worker whose tensors report themselves as CUDA tensors, staged by a stand-in for the GPU.

Usage: python device_staging_worker.py ROUNDS [DELAY_S] [COPY_BYTES]
The stand-in (byteps.testkit.device_stand_in) copies host memory on a thread
of its own, DELAY_S (default 1 ms) per copy, so the DEVICE_TO_HOST and
HOST_TO_DEVICE stages, the copy waiter and the pinned-buffer reuse run as
they do on a GPU. COPY_BYTES (default 32768) replaces
byteps.common.device_staging.COPY_BYTES, the least bytes one copy moves, so
that these small tensors take several copies each way. Every result is
checked against a numpy reference; prints ``STAGED OK ...``.
"""

from __future__ import annotations

import sys

import numpy as np

import byteps.common as bps
from byteps.common import PushPullOptions, device_staging
from byteps.common.api import worker
from byteps.testkit import device_stand_in
from byteps.testkit.push_pull_worker import check, generate

TENSORS = [  # (name, dtype, count, average, in place)
    ("weights", "float32", 50_000, True, True),
    ("bias", "float64", 3, False, True),
    ("embedding", "float16", 20_001, True, False),
    ("steps", "int64", 7_000, False, False),
]


def main() -> None:
    rounds = int(sys.argv[1])
    engines = device_stand_in.install(delay_s=float(sys.argv[2]) if len(sys.argv) > 2 else 0.001)
    device_staging.COPY_BYTES = int(sys.argv[3]) if len(sys.argv) > 3 else 32768
    bps.init()
    rank, size = bps.rank(), bps.size()
    for round_ in range(rounds):
        pending = []
        for name, dtype, count, average, in_place in TENSORS:
            data = generate(name, dtype, count, rank, round_)
            tensor = device_stand_in.StandInCudaTensor(data)
            output = None if in_place else device_stand_in.StandInCudaTensor(np.zeros_like(data))
            handle = worker().push_pull_async(tensor, name, PushPullOptions(average=average, output=output, dtype=dtype,
                                                                             stream=1234))
            pending.append(((name, dtype, count, average), data if in_place else output.host_array, handle))
        for (name, dtype, count, average), result, handle in pending:
            handle.wait()
            check({"name": name, "dtype": dtype, "count": count, "average": average}, result, size, round_)
    engine = engines[0]
    on_gpu = worker().config.gpu_local_aggregation and worker().local_size > 1
    if on_gpu:
        # GPU-side local aggregation: one device slot per tensor, one copy into it per round; a partition's
        # root alone sums it, copies it to the host and its result back; one pinned buffer per tensor
        assert engine.shared_slots == len(TENSORS), vars(engine)
        crossing = engine.reductions if worker().config.num_server else 0  # no servers: the local sum is all
        assert engine.copies_to_host == crossing == engine.copies_to_device and engine.reductions, vars(engine)
        assert engine.pinned_buffers == len(TENSORS), engine.pinned_buffers
    else:
        # several copies each way per tensor (none for a single process); one pinned buffer per tensor in
        # place, two out of place, reused round after round
        if worker().is_distributed:
            assert engine.copies_to_host > 2 * rounds * len(TENSORS), vars(engine)
            assert engine.copies_to_device >= rounds * len(TENSORS), vars(engine)  # runs as results come
        assert engine.pinned_buffers == sum(1 if t[4] else 2 for t in TENSORS), engine.pinned_buffers
        assert engine.shared_slots == engine.reductions == 0, vars(engine)
    assert engine.handed_over == [1234] * (rounds * len(TENSORS)), engine.handed_over
    print(f"STAGED OK rank {rank} of {size}: {rounds} rounds, {engine.copies_to_host} copies to the host, "
          f"{engine.copies_to_device} back, {engine.pinned_buffers} pinned buffers, "
          f"{engine.reductions} sums on the device", flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
