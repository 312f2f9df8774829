"""Unnamed ``hvd.allreduce(t)`` against the same call with a fixed name, as a Horovod user's benchmark runs it.

For each size (1, 16 and 64 MB of float32) the job runs ``--calls``
blocking allreduces with a fixed name, then ``--calls`` without a name, in
turns, ``--repeats`` times; an unnamed call gets a default name (see
``byteps.common.frontend.names``), and a name's first call sets up its
byteps tensor (ids, partition plan, servers' keys, the shared-memory
segment). Two layouts: ``bpslaunch -np 2`` (one machine, shared memory)
and ``bpslaunch --workers 2 --servers 1``. The report is the mean time per
call over each turn, the median over turns, and named / unnamed (1.0: an
unnamed call costs what a named one does; issue 50 asks for >= 0.9).

``--with-scalar`` follows every call with an allreduce of a scalar (a
metric averaged every step), named or not like the call: unnamed, the two
shapes alternate on one default name, and each switch is announced to the
other ranks (docs/decisions.md, "Default names").

    python benchmarks/bench_unnamed.py [--calls 8] [--repeats 3] [--mb 1 16 64] [--with-scalar]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

LAYOUTS = {"-np 2": ["-np", "2"], "--workers 2 --servers 1": ["--workers", "2", "--servers", "1"]}


def worker(args: argparse.Namespace) -> None:
    import torch

    import byteps.torch as bps

    bps.init()
    times = {}
    for mb in args.mb:
        tensor = torch.ones(mb * 262144)
        for _ in range(args.repeats):
            for kind in ("named", "unnamed"):
                bps.barrier()
                start = time.perf_counter()
                for _ in range(args.calls):
                    out = bps.allreduce(tensor, name=f"fixed.{mb}" if kind == "named" else None)
                    if args.with_scalar:
                        metric = bps.allreduce(torch.tensor(1.0), name="fixed.metric" if kind == "named" else None)
                        if metric.item() != 1.0:
                            raise SystemExit(f"rank {bps.rank()}: wrong average of the scalar ({kind})")
                times.setdefault(f"{mb} {kind}", []).append((time.perf_counter() - start) / args.calls)
                if not torch.equal(out, tensor):
                    raise SystemExit(f"rank {bps.rank()}: wrong average of {mb} MB ({kind})")
    if bps.rank() == 0:
        print("RESULT " + json.dumps(times), flush=True)
    bps.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mb", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--with-scalar", action="store_true", help="a scalar allreduce after every call")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    script = [sys.executable, os.path.abspath(__file__), "--worker", "--calls", str(args.calls),
              "--repeats", str(args.repeats), "--mb", *map(str, args.mb)] + (["--with-scalar"] * args.with_scalar)
    print("| layout | MB | named (ms/call) | unnamed (ms/call) | named / unnamed |")
    print("|---|---|---|---|---|")
    for layout, options in LAYOUTS.items():
        with tempfile.TemporaryDirectory() as scratch:
            proc = subprocess.run(["bpslaunch", "-q", *options, "--", *script], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=args.timeout, cwd=scratch)
        if proc.returncode:
            raise SystemExit(f"{layout}: the job failed ({proc.returncode}):\n{proc.stdout[-4000:]}")
        times = json.loads(next(line for line in proc.stdout.splitlines() if "RESULT " in line).split("RESULT ", 1)[1])
        for mb in args.mb:
            named, unnamed = (statistics.median(times[f"{mb} {kind}"]) for kind in ("named", "unnamed"))
            print(f"| `{layout}` | {mb} | {named * 1e3:.1f} | {unnamed * 1e3:.1f} | {named / unnamed:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
