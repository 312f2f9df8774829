"""Backup workers (BYTEPS_BACKUP_WORKERS) against none, in the same run: wall time and accuracy with stragglers.

Three worker machines and one server on this machine (bpslaunch --workers 3
--servers 1) train the digits model (benchmarks/backup_workers_job.py) with
emulated compute of --step-ms per step, one worker per step --slowdown
times slower. For each straggler pattern (``random``: a different worker
each step; ``fixed``: always the same one) the job runs with b = 0, with
b = 1, and with b = 1 where a worker that fell behind skips the rounds
that closed without it (``optimizer.skip_step()``), in turn, --repeats
times each. A job's time is its slowest
rank's training time (from its first step to its last, start-up left out);
reported are the medians, their ratios to b = 0 (how much sooner the job
ends with a backup worker) and rank 0's held-out accuracy.

    python benchmarks/bench_backup_workers.py [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "backup_workers_job.py")


#: The configurations each pattern runs: (name, BYTEPS_BACKUP_WORKERS, skip the rounds closed without one).
CONFIGS = (("b0", 0, False), ("b1", 1, False), ("b1_skip", 1, True))


def run_once(pattern: str, backup: int, skip: bool, args: argparse.Namespace) -> Dict[str, float]:
    env = {**os.environ, "BYTEPS_BACKUP_WORKERS": str(backup), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "byteps.launcher", "-q", "--workers", "3", "--servers", "1", "--",
               sys.executable, JOB, "--straggler", pattern, "--step-ms", str(args.step_ms),
               "--slowdown", str(args.slowdown), "--epochs", str(args.epochs), *(["--skip"] if skip else [])]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"job failed ({pattern}, b={backup}):\n{(done.stdout + done.stderr)[-3000:]}")
    ranks = [json.loads(line[line.index("{"):]) for line in done.stdout.splitlines() if '"wall_s"' in line]
    if len(ranks) != 3:
        raise SystemExit(f"expected 3 ranks' figures, got {ranks}")
    if len({r["checksum"] for r in ranks}) != 1:
        raise SystemExit(f"the ranks' parameters differ after training ({pattern}, b={backup}): {ranks}")
    return {"wall_s": max(r["wall_s"] for r in ranks),
            "accuracy": next(r["accuracy"] for r in ranks if r["rank"] == 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--slowdown", type=float, default=3.0)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--patterns", default="random,fixed", help="straggler patterns to run (random, fixed)")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    report = {"step_ms": args.step_ms, "slowdown": args.slowdown, "epochs": args.epochs, "patterns": {}}
    for pattern in args.patterns.split(","):
        runs: Dict[str, List[Dict[str, float]]] = {name: [] for name, _, _ in CONFIGS}
        for _ in range(args.repeats):
            for name, backup, skip in CONFIGS:
                runs[name].append(run_once(pattern, backup, skip, args))
        figures = {}
        for name, results in runs.items():
            figures[f"{name}_wall_s"] = statistics.median(r["wall_s"] for r in results)
            figures[f"{name}_accuracy"] = statistics.median(r["accuracy"] for r in results)
            figures[f"{name}_accuracies"] = sorted(r["accuracy"] for r in results)
        report["patterns"][pattern] = figures
        print(f"{pattern:6} straggler: " + "; ".join(
            f"{name} {figures[f'{name}_wall_s']:.2f} s ({figures['b0_wall_s'] / figures[f'{name}_wall_s']:.2f}x, "
            f"accuracy {figures[f'{name}_accuracy']:.3f}, "
            f"{min(figures[f'{name}_accuracies']):.3f}-{max(figures[f'{name}_accuracies']):.3f})"
            for name, _, _ in CONFIGS), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
