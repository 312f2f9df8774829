"""allgather and reducescatter of 100 MB through byteps.torch, against torch.distributed gloo in the same run.

For n workers on this machine:

* allgather: every rank contributes 100 MB / n of float32; the gathered
  tensor is 100 MB (byteps ``hvd.allgather`` vs gloo ``all_gather_into_tensor``);
* reducescatter: every rank contributes 100 MB and keeps its 100 MB / n of
  the sum (byteps ``hvd.reducescatter(op=Sum)`` vs gloo
  ``reduce_scatter_tensor``, or gloo ``all_reduce`` plus a slice where this
  torch's gloo has no reduce_scatter; the table says which).

byteps runs as ``bpslaunch -np n`` (one machine, local aggregation in
shared memory) and ``bpslaunch --workers n --servers 1`` (every rank a
machine of its own, one server); gloo as n ranks. Each job times
``--rounds`` rounds after a warm-up round and checks every result; the
report is the median round time and gloo's median over byteps' (> 1: byteps
is faster). Absolute times on a 2-core machine are noisy: compare the
ratios of one run.

    python benchmarks/bench_collectives.py [--mb 100] [--workers 2 4] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "cluster"))
from collectives import OPS, byteps_call, check, gloo_call, inputs  # noqa: E402

LAYOUTS = {"byteps -np n": lambda n: ["-np", str(n)],
           "byteps --workers n --servers 1": lambda n: ["--workers", str(n), "--servers", "1"]}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def byteps_worker(args: argparse.Namespace) -> None:
    import torch  # noqa: F401

    import byteps.torch as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    tensor = inputs(args.op, args.elements, rank, size)
    times = []
    for i in range(1 + args.rounds):
        hvd.barrier()
        start = time.perf_counter()
        out = byteps_call(hvd, args.op, tensor)
        end = time.perf_counter()
        check(args.op, out, args.elements, size)
        if i:
            times.append(end - start)
    Path(args.out, f"rank{rank}.json").write_text(json.dumps({"times": times}))
    hvd.shutdown()


def gloo_worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.world)
    tensor = inputs(args.op, args.elements, args.rank, args.world)
    times = []
    for i in range(1 + args.rounds):
        dist.barrier()
        start = time.perf_counter()
        out, how = gloo_call(args.op, tensor, args.rank, args.world)
        end = time.perf_counter()
        check(args.op, out, args.elements, args.world)
        if i:
            times.append(end - start)
    Path(args.out, f"rank{args.rank}.json").write_text(json.dumps({"times": times, "how": how}))
    dist.destroy_process_group()


def collect(out: Path, size: int) -> dict:
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(size)]
    per_round = [max(times) for times in zip(*(r["times"] for r in records))]  # a round ends with its slowest rank
    return {"median_s": statistics.median(per_round), "how": records[0].get("how", "")}


def run_byteps(layout, op: str, size: int, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "byteps.launcher", *layout(size), "--", sys.executable, __file__,
                   "--role", "byteps", "--op", op, "--elements", str(args.elements), "--rounds", str(args.rounds),
                   "--out", out]
        subprocess.run(command, check=True, timeout=600, stdout=subprocess.DEVNULL)
        return collect(Path(out), size)


def run_gloo(op: str, size: int, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as out:
        port = free_port()
        procs = [subprocess.Popen([sys.executable, __file__, "--role", "gloo", "--op", op, "--rank", str(r),
                                   "--world", str(size), "--port", str(port), "--elements", str(args.elements),
                                   "--rounds", str(args.rounds), "--out", out]) for r in range(size)]
        try:
            for proc in procs:
                if proc.wait(timeout=600):
                    raise SystemExit(f"gloo {op} rank failed")
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        return collect(Path(out), size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=("parent", "byteps", "gloo"), default="parent")
    parser.add_argument("--op", choices=OPS, default="allgather")
    parser.add_argument("--mb", type=float, default=100.0)
    parser.add_argument("--elements", type=int, default=0)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--out", default="")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.role == "byteps":
        return byteps_worker(args)
    if args.role == "gloo":
        return gloo_worker(args)
    args.elements = args.elements or int(args.mb * 1e6 / 4)
    rows = []
    print("| op | n | system | median s | gloo / system |\n|---|---|---|---|---|")
    for op in OPS:
        for size in args.workers:
            gloo = run_gloo(op, size, args)
            print(f"| {op} | {size} | gloo {gloo['how']} | {gloo['median_s']:.3f} | 1.00 |", flush=True)
            rows.append({"op": op, "n": size, "system": "gloo", **gloo})
            for label, layout in LAYOUTS.items():
                result = run_byteps(layout, op, size, args)
                ratio = gloo["median_s"] / result["median_s"]
                print(f"| {op} | {size} | {label} | {result['median_s']:.3f} | {ratio:.2f} |", flush=True)
                rows.append({"op": op, "n": size, "system": label, **result, "ratio": ratio})
    if args.json:
        Path(args.json).write_text(json.dumps({"mb": args.mb, "rounds": args.rounds, "rows": rows}, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
