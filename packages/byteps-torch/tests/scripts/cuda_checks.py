"""Worker of the CUDA tests: push_pull and allreduce of CUDA tensors checked against a CPU reference.

Usage: python cuda_checks.py ROUNDS
Every rank derives every rank's tensors from seeds, so each computes the
exact reference on the CPU. Tensors are several partitions long
(BYTEPS_PARTITION_BYTES is small in the tests), some out of place, some on
a side stream of the caller's, and the results are read without an
explicit synchronize: the copies back must be ordered before the caller's
next work on its stream. Prints ``CUDA OK ...``.
"""

from __future__ import annotations

import sys
import zlib

import torch

import byteps.torch as bps

CASES = [  # name, dtype, elements
    ("w32", torch.float32, 300_001),
    ("w64", torch.float64, 5_000),
    ("h16", torch.float16, 70_000),
    ("b16", torch.bfloat16, 70_000),
    ("i64", torch.int64, 9_999),
    ("scalar", torch.float32, 1),
]


def data(name: str, dtype: torch.dtype, count: int, rank: int, round_: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(zlib.crc32(f"{name}:{rank}:{round_}".encode()))
    if dtype == torch.int64:
        return torch.randint(-1000, 1000, (count,), generator=generator)
    return torch.rand(count, generator=generator, dtype=torch.float64).mul(2).sub(1).to(dtype)


def reference(name: str, dtype: torch.dtype, count: int, size: int, round_: int, average: bool) -> torch.Tensor:
    total = sum(data(name, dtype, count, r, round_).to(torch.float64) for r in range(size))
    if not average:
        return total
    return torch.div(total, size, rounding_mode="trunc") if dtype == torch.int64 else total / size


def check(what: str, got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    assert got.is_cuda, f"{what}: the result is on {got.device}"
    assert got.dtype == dtype, f"{what}: {got.dtype}"
    tolerance = {torch.float16: 2e-3, torch.bfloat16: 1e-2}.get(dtype, 1e-6)
    got = got.cpu().to(torch.float64)
    if not torch.allclose(got, want, rtol=tolerance, atol=tolerance * 4):
        bad = (got - want).abs().argmax().item()
        raise AssertionError(f"{what}: at {bad} got {got[bad].item()}, expected {want[bad].item()}")


def main() -> None:
    rounds = int(sys.argv[1])
    bps.init()
    rank, size = bps.rank(), bps.size()
    device = torch.device("cuda", bps.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(device)
    side = torch.cuda.Stream()
    for round_ in range(rounds):
        for i, (name, dtype, count) in enumerate(CASES):
            average = i % 2 == 0
            x = data(name, dtype, count, rank, round_).to(device)
            want = reference(name, dtype, count, size, round_, average)
            if round_ % 2:  # the caller's own stream: the copies wait for it and it waits for them
                with torch.cuda.stream(side):
                    y = (x * 1).add_(0) if dtype != torch.int64 else x.clone()
                    handle = bps.push_pull_async_inplace(y, average=average, name=f"inplace.{name}")
                    result = bps.synchronize(handle)
                    check(f"round {round_} {name} in place on a side stream", result.clone(), want, dtype)
                side.synchronize()
            else:
                result = bps.push_pull(x, average=average, name=f"out.{name}")
                assert result.data_ptr() != x.data_ptr()
                check(f"round {round_} {name} out of place", result, want, dtype)
                unchanged = data(name, dtype, count, rank, round_).to(device)
                assert torch.equal(x, unchanged), f"{name}: the input changed"
        summed = bps.allreduce(torch.full((4, 1000), float(rank + 1), device=device), op=bps.Sum, name="allreduce")
        assert summed.is_cuda and torch.all(summed == size * (size + 1) / 2).item(), summed
        root = torch.arange(10_000, dtype=torch.float32, device=device) * (rank + 1)
        bps.broadcast_(root, root_rank=0, name="broadcast")
        assert torch.equal(root.cpu(), torch.arange(10_000, dtype=torch.float32)), root[:4]
    torch.cuda.synchronize()
    from byteps.common.api import worker
    slots = len(worker().tasks.staging._shared)  # tensors summed with the local peers on the GPU
    print(f"CUDA OK rank {rank} of {size} on {device}: {rounds} rounds of {len(CASES)} tensors, "
          f"{slots} summed on the GPU", flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
