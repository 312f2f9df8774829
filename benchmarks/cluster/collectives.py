"""The gathers of the collective benchmarks: inputs, one call on each system, the check of its result.

Shared by ``benchmarks/bench_collectives.py`` (one machine) and the
cluster benchmark's workers (``--op allgather|reducescatter``):

* allgather: every rank contributes ``elements / size`` float32 values of
  ``rank + 1``; the result is every rank's, in rank order;
* reducescatter: every rank contributes ``elements`` (rounded down to a
  multiple of ``size``) values of ``rank + 1`` and keeps its ``1/size`` of
  the sum.

Example::

    tensor = inputs("allgather", 25_000_000, rank, size)
    out = byteps_call(hvd, "allgather", tensor)
    check("allgather", out, 25_000_000, size)
"""

from __future__ import annotations

from typing import Tuple

__all__ = ["OPS", "inputs", "check", "byteps_call", "gloo_call"]

OPS = ("allgather", "reducescatter")


def inputs(op: str, elements: int, rank: int, size: int):
    import torch
    if op == "allgather":
        return torch.full((elements // size,), float(rank + 1))
    return torch.full((elements - elements % size,), float(rank + 1))


def check(op: str, out, elements: int, size: int) -> None:
    import torch
    if op == "allgather":
        want = torch.arange(1, size + 1, dtype=torch.float32).repeat_interleave(elements // size)
    else:
        want = torch.full(((elements - elements % size) // size,), float(size * (size + 1) // 2))
    if out.shape != want.shape or not torch.equal(out, want):
        raise SystemExit(f"{op}: wrong result {tuple(out.shape)} {out[:4].tolist()}")


def byteps_call(hvd, op: str, tensor):
    """One collective through byteps.torch (``hvd``), as a Horovod script calls it."""
    if op == "allgather":
        return hvd.allgather(tensor, name="bench.allgather")
    return hvd.reducescatter(tensor, op=hvd.Sum, name="bench.reducescatter")


def gloo_call(op: str, tensor, rank: int, world: int) -> Tuple[object, str]:
    """One collective through torch.distributed (gloo); the result and which gloo call made it."""
    import torch
    import torch.distributed as dist
    if op == "allgather":
        out = torch.empty(tensor.numel() * world)
        dist.all_gather_into_tensor(out, tensor)
        return out, "all_gather_into_tensor"
    out = torch.empty(tensor.numel() // world)
    try:
        dist.reduce_scatter_tensor(out, tensor)
        return out, "reduce_scatter_tensor"
    except (RuntimeError, NotImplementedError, ValueError):
        summed = tensor.clone()
        dist.all_reduce(summed)
        mine = summed[rank * out.numel():(rank + 1) * out.numel()].clone()
        return mine, "all_reduce + slice (no gloo reduce_scatter)"
