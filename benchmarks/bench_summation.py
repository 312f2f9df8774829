"""Summation throughput of byteps' kernels and server engine against numpy.

Three measurements, each against a numpy baseline timed in the same run on
the same buffers (median of --repeats after one warm-up; the variants of a
case are interleaved within each repeat so that drift hits all alike):

1. float32 ``dst += src`` of --mb MiB: ``np.add(a, b, out=a)`` vs
   ``ServerEngine.reduce_into`` on 1 and 2 threads. Goal: >= 1.5x on 2.
2. float16 ``dst += src``: numpy's float16 add vs ``byteps.common._C.sum_into``
   (1 thread) and the engine's ``reduce_into`` on 2 threads. Goal: >= 5x.
   For information, the same at 4 MiB (cache-resident, each call repeated
   so a sample lasts a few ms): what the pool gives where one core does not
   already saturate memory bandwidth.
3. The server's real path, for information: a round of 2 workers' float16
   pushes summed in a float32 accumulator and rounded back
   (``engine.push`` x 2), vs the same three numpy steps (widen-copy, add,
   narrow-copy); and a round of 2 workers' float32 pushes vs numpy's
   one-pass ``np.add(a, b, out=c)``, the least memory traffic there is.

GB/s is payload: bytes of the ``src`` operand (cases 1-2) or of all pushes
(case 3) per second, 1 GB = 1e9 bytes.

    python benchmarks/bench_summation.py [--mb 100] [--repeats 7] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Callable, Dict, List

import numpy as np

from byteps.common import _C as kernels
from byteps.common.dtypes import DType
from byteps.server.engine import create_engine


def interleaved_medians(variants: Dict[str, Callable[[], None]], repeats: int, inner: int = 1) -> Dict[str, float]:
    """Median seconds per call of each variant; one warm-up call each, then
    round-robin repeats of ``inner`` calls."""
    for fn in variants.values():
        fn()
    samples: Dict[str, List[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            samples[name].append((time.perf_counter() - start) / inner)
    return {name: statistics.median(times) for name, times in samples.items()}


def case_rows(
    title: str, payload: int, variants: Dict[str, Callable[[], None]], repeats: int, inner: int = 1
) -> List[dict]:
    """Times variants; the first one is the baseline every ratio refers to."""
    medians = interleaved_medians(variants, repeats, inner)
    baseline = next(iter(variants))
    rows = []
    for name, seconds in medians.items():
        rows.append({
            "case": title,
            "what": name,
            "seconds": seconds,
            "gbps": payload / seconds / 1e9,
            "ratio": medians[baseline] / seconds,
        })
    return rows


def bench_float32(nbytes: int, repeats: int, title: str = "float32 dst += src", inner: int = 1) -> List[dict]:
    count = nbytes // 4
    rng = np.random.default_rng(0)
    a = rng.standard_normal(count, dtype=np.float32)
    b = rng.standard_normal(count, dtype=np.float32)
    one, two = create_engine(1, 1), create_engine(2, 1)
    return case_rows(title, nbytes, {
        "numpy np.add(a, b, out=a)": lambda: np.add(a, b, out=a),
        "ServerEngine(1 thread).reduce_into": lambda: one.reduce_into(a, b, DType.FLOAT32),
        "ServerEngine(2 threads).reduce_into": lambda: two.reduce_into(a, b, DType.FLOAT32),
    }, repeats, inner)


def bench_float16(nbytes: int, repeats: int) -> List[dict]:
    count = nbytes // 2
    rng = np.random.default_rng(1)
    a = rng.standard_normal(count, dtype=np.float32).astype(np.float16)
    b = (rng.standard_normal(count, dtype=np.float32) * 1e-3).astype(np.float16)  # keeps sums finite
    two = create_engine(2, 1)
    return case_rows("float16 dst += src", nbytes, {
        "numpy np.add(a, b, out=a) float16": lambda: np.add(a, b, out=a),
        "byteps.common._C.sum_into (1 thread)": lambda: kernels.sum_into(a, b, DType.FLOAT16),
        "ServerEngine(2 threads).reduce_into": lambda: two.reduce_into(a, b, DType.FLOAT16),
    }, repeats)


def bench_server_round(nbytes: int, repeats: int, dtype: DType = DType.FLOAT16) -> List[dict]:
    storage = np.dtype(dtype.storage)
    count = nbytes // storage.itemsize
    rng = np.random.default_rng(2)
    pushes = [rng.standard_normal(count, dtype=np.float32).astype(storage) for _ in range(2)]

    if dtype == DType.FLOAT16:
        acc = np.empty(count, np.float32)
        out = np.empty(count, np.float16)

        def numpy_round() -> None:
            np.copyto(acc, pushes[0])
            np.add(acc, pushes[1], out=acc)
            np.copyto(out, acc, casting="same_kind")

        variants = {"numpy widen + add + narrow": numpy_round}
    else:
        out = np.empty(count, storage)
        variants = {"numpy np.add(a, b, out=c)": lambda: np.add(pushes[0], pushes[1], out=out)}
    for threads in (1, 2):
        engine = create_engine(threads, 2)
        engine.declare(0, nbytes, dtype)
        state = {"round": 0}

        def engine_round(engine=engine, state=state) -> None:
            r = state["round"]
            engine.push(0, r, pushes[0])
            assert engine.push(0, r, pushes[1])
            state["round"] = r + 1

        variants[f"ServerEngine({threads} thread{'s' if threads > 1 else ''}) 2 pushes"] = engine_round
    name = storage.name
    return case_rows(f"{name} server round, 2 workers", 2 * nbytes, variants, repeats)


def markdown(rows: List[dict]) -> str:
    lines = ["| case | what | GB/s | ratio vs numpy |", "|---|---|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['case']} | {row['what']} | {row['gbps']:.2f} | {row['ratio']:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100, help="buffer size in MiB (default 100)")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per variant (default 7)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args()
    nbytes = args.mb * 1024 * 1024

    started = time.perf_counter()
    rows = bench_float32(nbytes, args.repeats)
    rows += bench_float16(nbytes, args.repeats)
    rows += bench_float32(4 << 20, args.repeats, "float32 dst += src, 4 MiB (info)", inner=20)
    rows += bench_server_round(nbytes, args.repeats)
    rows += bench_server_round(nbytes, args.repeats, DType.FLOAT32)

    features = kernels.cpu_features()

    def ratio(case: str, what: str) -> float:
        return next(row["ratio"] for row in rows if row["case"] == case and row["what"] == what)

    goals = {
        "float32 2 threads >= 1.5x": ratio("float32 dst += src", "ServerEngine(2 threads).reduce_into") >= 1.5,
        "float16 >= 5x": min(ratio("float16 dst += src", "byteps.common._C.sum_into (1 thread)"),
                             ratio("float16 dst += src", "ServerEngine(2 threads).reduce_into")) >= 5.0,
    }
    print(f"cpu_features: {features}; os.cpu_count(): {os.cpu_count()}; "
          f"{args.mb} MiB buffers, median of {args.repeats}")
    print()
    print(markdown(rows))
    print()
    for goal, met in goals.items():
        print(f"goal {goal}: {'met' if met else 'NOT met'}")
    print(f"total {time.perf_counter() - started:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mb": args.mb, "repeats": args.repeats, "cpu_count": os.cpu_count(),
                       "cpu_features": features, "goals": goals, "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
