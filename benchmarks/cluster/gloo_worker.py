"""One torch.distributed (gloo) worker of the cluster benchmark: all_reduce a workload, time each round.

The baseline ring allreduce, on the same hosts as byteps' workers. Gradients
are packed into 25 MB buckets, as DDP does (bucket_cap_mb=25); a single
tensor is reduced as it is. Each round starts at a barrier and all_reduces
every bucket asynchronously, as DDP overlaps them. ``--op allgather|
reducescatter`` times that collective of the 100MB tensor instead
(:mod:`collectives`), checking every round.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from timing import now, role_env, write_result
from workloads import TENSOR_100MB, gradient_shapes

BUCKET_BYTES = 25 * 1024 * 1024


def buckets(shapes, rank: int):
    """Flat float32 buckets holding every gradient, filled with rank + 1."""
    out, pending = [], 0
    for _, shape in shapes:
        count = 1
        for d in shape:
            count *= d
        if pending and (pending + count) * 4 > BUCKET_BYTES:
            out.append(pending)
            pending = 0
        pending += count
    out.append(pending)
    return [torch.full((count,), float(rank + 1), dtype=torch.float32) for count in out]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", required=True)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", required=True)
    parser.add_argument("--master", required=True, help="address:port of rank 0's rendezvous")
    parser.add_argument("--op", choices=("allreduce", "allgather", "reducescatter"), default="allreduce")
    args = parser.parse_args()
    role = role_env()
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", os.environ.get("DMLC_INTERFACE", "eth0"))
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=role["rank"],
                            world_size=role["size"])
    if args.op != "allreduce":
        return collective_rounds(args, role)
    shapes = gradient_shapes(args.workload)
    tensors = [torch.full(shape, float(role["rank"] + 1)) for _, shape in shapes] if len(shapes) == 1 \
        else buckets(shapes, role["rank"])
    expected = float(sum(range(1, role["size"] + 1)))

    times, starts = [], []
    for i in range(args.warmup + args.repeats):
        dist.barrier()
        wall, start = time.time(), now()
        works = [dist.all_reduce(t, async_op=True) for t in tensors]
        for work in works:
            work.wait()
        elapsed = now() - start
        if i >= args.warmup:
            times.append(elapsed)
            starts.append(wall)
        if i == 0:
            for t in tensors:
                if not torch.allclose(t, torch.full_like(t, expected)):
                    raise SystemExit(f"all_reduce gave {t[:4]}, expected {expected}")
    write_result(args.out, {"rank": role["rank"], "times": times, "starts": starts})
    print(f"rank {role['rank']}: {args.workload} rounds " + " ".join(f"{t:.3f}" for t in times), flush=True)
    dist.destroy_process_group()


def collective_rounds(args: argparse.Namespace, role) -> None:
    """--op allgather|reducescatter: each round one gloo collective of the 100 MB tensor, checked."""
    from collectives import check, gloo_call, inputs

    if args.workload != "100MB":
        raise SystemExit(f"--op {args.op} times the 100MB workload only, not {args.workload}")
    tensor = inputs(args.op, TENSOR_100MB, role["rank"], role["size"])
    times, starts = [], []
    for i in range(args.warmup + args.repeats):
        dist.barrier()
        wall, start = time.time(), now()
        out, how = gloo_call(args.op, tensor, role["rank"], role["size"])
        elapsed = now() - start
        check(args.op, out, TENSOR_100MB, role["size"])
        if i >= args.warmup:
            times.append(elapsed)
            starts.append(wall)
    write_result(args.out, {"rank": role["rank"], "times": times, "starts": starts, "how": how})
    print(f"rank {role['rank']}: {args.op} 100MB ({how}) rounds " + " ".join(f"{t:.3f}" for t in times), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
