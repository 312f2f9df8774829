"""The reference worker of test jobs: push_pulls generated tensors, checks them against numpy.

Usage: python -m byteps.testkit.push_pull_worker SPEC_JSON
SPEC_JSON: {"rounds": R, "tensors": [{"name", "dtype", "count", "average"}...], "async": bool}
Every rank derives every other rank's data from the same seeds, so each can
compute the exact reference sum itself. Exits 1 with a message on a mismatch.

byteps-server's and byteps-common's tests both run it as their jobs'
workers. It is a program, run in a job's worker processes: it uses numpy and
byteps-common, which the package under test brings; ``byteps.testkit``
itself never imports it.
"""

from __future__ import annotations

import json
import sys
import zlib

import numpy as np

import byteps.common as bps


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 storage by truncation (the values are chosen exactly representable)."""
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def bf16_to_float(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def generate(name: str, dtype: str, count: int, rank: int, round_: int) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(f"{name}:{rank}:{round_}".encode()))
    if dtype in ("int32", "int64"):
        return rng.integers(-1000, 1000, size=count).astype(dtype)
    values = rng.uniform(-1.0, 1.0, size=count).astype(np.float32)
    if dtype == "bfloat16":
        return bf16_bits(values)
    return values.astype(dtype)


def as_float64(data: np.ndarray, dtype: str) -> np.ndarray:
    return bf16_to_float(data).astype(np.float64) if dtype == "bfloat16" else data.astype(np.float64)


def reference(name: str, dtype: str, count: int, size: int, round_: int, average: bool) -> np.ndarray:
    parts = [generate(name, dtype, count, r, round_) for r in range(size)]
    if dtype in ("int32", "int64"):
        total = np.sum(np.stack(parts), axis=0, dtype=dtype)
        return total // size if average else total
    total = np.sum(np.stack([as_float64(p, dtype) for p in parts]), axis=0)
    return total / size if average else total


def check(tensor: dict, result: np.ndarray, size: int, round_: int) -> None:
    name, dtype, count, average = tensor["name"], tensor["dtype"], tensor["count"], tensor["average"]
    expected = reference(name, dtype, count, size, round_, average)
    if dtype in ("int32", "int64"):
        ok = np.array_equal(result, expected)
    else:
        got = as_float64(result, dtype)
        rtol = {"float32": 1e-5, "float64": 1e-12, "float16": 2e-3, "bfloat16": 1e-2}[dtype]
        ok = np.allclose(got, expected, rtol=rtol, atol=rtol * size)
    if not ok:
        got = as_float64(result, dtype) if dtype not in ("int32", "int64") else result
        bad = np.flatnonzero(~np.isclose(got, expected, rtol=1e-2)) if dtype not in ("int32", "int64") \
            else np.flatnonzero(result != expected)
        first = bad[:5].tolist()
        print(f"MISMATCH rank {bps.rank()} tensor {name} ({dtype} x {count}) round {round_}: "
              f"at {first}: got {got[first]}, expected {expected[first]}", flush=True)
        sys.exit(1)


def main() -> None:
    spec = json.loads(sys.argv[1])
    bps.init()
    rank, size = bps.rank(), bps.size()
    for tensor in spec["tensors"]:
        bps.declare(tensor["name"])
    for round_ in range(spec["rounds"]):
        inputs = [(t, generate(t["name"], t["dtype"], t["count"], rank, round_)) for t in spec["tensors"]]
        if spec.get("async"):
            handles = [(t, bps.push_pull_async(x, name=t["name"], average=t["average"], dtype=t["dtype"]))
                       for t, x in inputs]
            results = [(t, bps.synchronize(h)) for t, h in handles]
        else:
            results = [(t, bps.push_pull(x, name=t["name"], average=t["average"], dtype=t["dtype"]))
                       for t, x in inputs]
        for t, result in results:
            check(t, result, size, round_)
    print(f"rank {rank} of {size}: {spec['rounds']} rounds of {len(spec['tensors'])} tensors OK", flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
