"""Tensor fusion: 500 tensors of 4 KB per round, fused vs unfused, 2 workers + 1 server on loopback.

Each round push_pulls (averages) the same 500 float32 tensors of 4 KB on
both workers and waits for all of them: unfused, one push_pull_async per
tensor (each pays the per-message cost: a task, a PUSH, a PULL, a round
trip, a handle); fused, one push_pull_group_async call, which packs them into
buckets of BYTEPS_FUSION_THRESHOLD bytes (default 4096000: one 2 MB bucket).
Both modes run in the same job, alternating repeat by repeat, so the
machine's noise hits both alike. Reported: rounds per second of each
(median over repeats) and the median of the per-repeat ratios.

    python benchmarks/bench_fusion.py [--tensors 500] [--kb 4] [--rounds 20] [--repeats 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import numpy as np


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def worker_main(args: argparse.Namespace) -> None:
    """One worker process: time both modes, print rank 0's figures as JSON."""
    import byteps.common as bps

    bps.init()
    count = args.kb * 1024 // 4
    unfused = [np.ones(count, dtype=np.float32) for _ in range(args.tensors)]
    fused = [np.ones(count, dtype=np.float32) for _ in range(args.tensors)]
    unfused_names = [f"unfused.{i}" for i in range(args.tensors)]
    fused_names = [f"fused.{i}" for i in range(args.tensors)]

    def unfused_round() -> None:
        handles = [bps.push_pull_async(t, name=n) for t, n in zip(unfused, unfused_names)]
        for handle in handles:
            bps.synchronize(handle)

    def fused_round() -> None:
        for handle in bps.push_pull_group_async(fused, fused_names):
            bps.synchronize(handle)

    def rounds_per_second(one_round) -> float:
        start = time.perf_counter()
        for _ in range(args.rounds):
            one_round()
        return args.rounds / (time.perf_counter() - start)

    for one_round in (unfused_round, fused_round):  # warm up: declare, allocate, connect
        one_round()
    figures = {"unfused": [], "fused": []}
    for _ in range(args.repeats):
        figures["unfused"].append(rounds_per_second(unfused_round))
        figures["fused"].append(rounds_per_second(fused_round))
    # every input was ones on both workers: the averages must be ones
    assert all(t[0] == 1.0 and t[-1] == 1.0 for t in unfused + fused), "wrong average"
    if bps.rank() == 0:
        print("FIGURES " + json.dumps(figures), flush=True)
    bps.shutdown()


def run_job(args: argparse.Namespace) -> dict:
    port = free_port()
    env = {**os.environ, "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
           "DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "1", "DMLC_INTERFACE": "lo", "PYTHONUNBUFFERED": "1"}
    server = [sys.executable, "-m", "byteps.server"]
    worker = [sys.executable, os.path.abspath(__file__), "--as-worker", "--tensors", str(args.tensors),
              "--kb", str(args.kb), "--rounds", str(args.rounds), "--repeats", str(args.repeats)]
    procs = [subprocess.Popen(server, env={**env, "DMLC_ROLE": role}) for role in ("scheduler", "server")]
    workers = [subprocess.Popen(worker, env={**env, "DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(w)},
                                stdout=subprocess.PIPE, text=True) for w in range(2)]
    try:
        outputs = [w.communicate(timeout=600)[0] for w in workers]
        if any(w.returncode != 0 for w in workers):
            raise SystemExit(f"a worker failed: exit codes {[w.returncode for w in workers]}\n" + "\n".join(outputs))
        for proc in procs:
            proc.wait(timeout=30)
    finally:
        for proc in procs + workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    line = next(line for line in outputs[0].splitlines() if line.startswith("FIGURES "))
    return json.loads(line[len("FIGURES "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=500)
    parser.add_argument("--kb", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=20, help="rounds per timed repeat, each mode")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--as-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.as_worker:
        worker_main(args)
        return
    raw = run_job(args)
    ratios = [f / u for f, u in zip(raw["fused"], raw["unfused"])]
    figures = {
        "tensors": args.tensors, "tensor_kb": args.kb, "rounds": args.rounds, "repeats": args.repeats,
        "fusion_threshold": int(os.environ.get("BYTEPS_FUSION_THRESHOLD", 4096000)),
        "unfused_rounds_per_s": statistics.median(raw["unfused"]),
        "fused_rounds_per_s": statistics.median(raw["fused"]),
        "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
        "raw": raw,
    }
    print(f"| mode | rounds/s (median of {args.repeats}) | tensors/s |\n|---|---:|---:|\n"
          f"| unfused: {args.tensors} x push_pull_async | {figures['unfused_rounds_per_s']:.1f} | "
          f"{figures['unfused_rounds_per_s'] * args.tensors:.0f} |\n"
          f"| fused: push_pull_group_async | {figures['fused_rounds_per_s']:.1f} | "
          f"{figures['fused_rounds_per_s'] * args.tensors:.0f} |\n\n"
          f"fused / unfused: median {figures['ratio_median']:.1f}x "
          f"(per repeat {figures['ratio_min']:.1f}x–{figures['ratio_max']:.1f}x)")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=2)


if __name__ == "__main__":
    main()
