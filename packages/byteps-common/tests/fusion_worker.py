"""A worker process of the fusion test jobs: grouped push_pulls checked against numpy.

Usage: python fusion_worker.py SPEC_JSON
SPEC_JSON: {"rounds": R, "tensors": [{"name", "dtype", "count", "average"}...],
            "mismatch": bool (rank 1 renames its first tensor: a bucket whose membership differs),
            "busy_check": bool (first resubmit a group in flight, see busy_check)}
Each round submits the averaged tensors as one group and the summed ones as
another, then checks every result with byteps.testkit.push_pull_worker's reference. Prints
how many buckets the plan had, so the test knows fusion really happened.
"""

from __future__ import annotations

import json
import sys
import time

import byteps.common as bps
from byteps.common.dtypes import dtype_of
from byteps.common.fusion import plan_fusion
from byteps.testkit.push_pull_worker import check, generate


def busy_check(names: list, tensors: list, rank: int) -> None:
    """Submitting a group again while its buckets are in flight is a ValueError, and corrupts nothing.

    Rank 1 starts 1 s late, so rank 0's first call is certainly still in flight.
    """
    if rank == 1:
        time.sleep(1.0)
    inputs = [generate(t["name"], t["dtype"], t["count"], rank, 0) for t in tensors]
    dtypes = [t["dtype"] for t in tensors]
    handles = bps.push_pull_group_async(inputs, names, dtypes=dtypes)
    if rank == 0:
        again = [generate(t["name"], t["dtype"], t["count"], rank, 99) for t in tensors]
        try:
            bps.push_pull_group_async(again, names, dtypes=dtypes)
        except ValueError as exc:
            assert "still in flight" in str(exc), exc
            print(f"BUSY: {exc}", flush=True)
        else:
            raise AssertionError("a second submission of the same group while in flight was accepted")
    for tensor, handle in zip(tensors, handles):
        check(tensor, bps.synchronize(handle), bps.size(), 0)


def main() -> None:
    spec = json.loads(sys.argv[1])
    bps.init()
    rank, size = bps.rank(), bps.size()
    config = bps.api.worker().config
    groups = {average: [t for t in spec["tensors"] if t["average"] == average] for average in (True, False)}
    names = {average: [t["name"] for t in tensors] for average, tensors in groups.items()}
    if spec.get("mismatch") and rank == 1:
        names[True][0] += ".renamed"
    buckets = 0
    for average, tensors in groups.items():
        items = [(n, t["count"] * dtype_of(t["dtype"]).itemsize, t["dtype"]) for n, t in zip(names[average], tensors)]
        buckets += sum(g.fused for g in plan_fusion(items, config.fusion_threshold, config.fusion_max_tensor_bytes))
    print(f"rank {rank}: {buckets} buckets", flush=True)
    if spec.get("busy_check"):
        busy_check(names[True], groups[True], rank)
    for round_ in range(spec["rounds"]):
        submitted = []
        for average, tensors in groups.items():
            inputs = [generate(t["name"], t["dtype"], t["count"], rank, round_) for t in tensors]
            handles = bps.push_pull_group_async(inputs, names[average], average=average,
                                                dtypes=[t["dtype"] for t in tensors])
            submitted += list(zip(tensors, handles))
        for tensor, handle in submitted:
            try:
                result = bps.synchronize(handle)
            except bps.PushPullError as exc:
                print(f"FAILED: {exc}", flush=True)
                sys.exit(1)
            check(tensor, result, size, round_)
    print(f"rank {rank} of {size}: {spec['rounds']} rounds of {len(spec['tensors'])} fused tensors OK", flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
