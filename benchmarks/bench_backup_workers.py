"""Backup workers (BYTEPS_BACKUP_WORKERS) against none, in the same run: wall time and accuracy with stragglers.

Three worker machines and one server on this machine (bpslaunch --workers 3
--servers 1) train the digits model with emulated compute of --step-ms per
step, one worker per step --slowdown times slower, in each framework of
--framework (a comma list of torch, tf, mxnet; torch by default): the job
is benchmarks/backup_workers_job.py for torch and
benchmarks/backup_workers_job_<framework>.py for the others, run by that
framework's python (--python-torch, --python-tf, --python-mxnet; this one by
default), which also runs the launcher (``python -m byteps.launcher``), so
byteps must be importable there. For each straggler pattern (``random``: a
different worker each step; ``fixed``: always the same one) the job runs
with b = 0, with b = 1, and with b = 1 where a worker that fell behind
skips the rounds that closed without it (``skip_step()``), in turn,
--repeats times each. A job's time is its slowest rank's training time
(from its first step to its last, start-up left out); reported per
framework are the medians, their ratios to b = 0 of the same framework in
the same run (how much sooner the job ends with a backup worker) and rank
0's held-out accuracy.

    python benchmarks/bench_backup_workers.py [--repeats 3] [--json out.json]
    python benchmarks/bench_backup_workers.py --framework torch,mxnet --python-mxnet /path/to/mxnet-env/bin/python
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
FRAMEWORKS = ("torch", "tf", "mxnet")


#: The configurations each pattern runs: (name, BYTEPS_BACKUP_WORKERS, skip the rounds closed without one).
CONFIGS = (("b0", 0, False), ("b1", 1, False), ("b1_skip", 1, True))


def job_of(framework: str) -> str:
    """The job file of ``framework``: the same CLI and final JSON line per rank in each."""
    return os.path.join(HERE, "backup_workers_job.py" if framework == "torch" else
                        f"backup_workers_job_{framework}.py")


def parse_frameworks(text: str, parser: argparse.ArgumentParser) -> List[str]:
    frameworks = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in frameworks if name not in FRAMEWORKS]
    if unknown or not frameworks:
        parser.error(f"--framework {text!r}: a comma list of {', '.join(FRAMEWORKS)}, e.g. --framework torch,mxnet")
    for name in frameworks:
        if not os.path.isfile(job_of(name)):
            parser.error(f"--framework {name}: its job file {job_of(name)} does not exist")
    return list(dict.fromkeys(frameworks))


def run_once(framework: str, python: str, pattern: str, backup: int, skip: bool,
             args: argparse.Namespace) -> Dict[str, float]:
    env = {**os.environ, "BYTEPS_BACKUP_WORKERS": str(backup), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    command = [python, "-m", "byteps.launcher", "-q", "--workers", "3", "--servers", "1", "--",
               python, job_of(framework), "--straggler", pattern, "--step-ms", str(args.step_ms),
               "--slowdown", str(args.slowdown), "--epochs", str(args.epochs), *(["--skip"] if skip else [])]
    what = f"{framework}, {pattern}, b={backup}{', skip' if skip else ''}"
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"job failed ({what}; {python}):\n{(done.stdout + done.stderr)[-3000:]}")
    ranks = [json.loads(line[line.index("{"):]) for line in done.stdout.splitlines() if '"wall_s"' in line]
    if len(ranks) != 3:
        raise SystemExit(f"expected 3 ranks' figures ({what}), got {ranks}")
    if len({r["checksum"] for r in ranks}) != 1:
        raise SystemExit(f"the ranks' parameters differ after training ({what}): {ranks}")
    return {"wall_s": max(r["wall_s"] for r in ranks),
            "accuracy": next(r["accuracy"] for r in ranks if r["rank"] == 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--slowdown", type=float, default=3.0)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--patterns", default="random,fixed", help="straggler patterns to run (random, fixed)")
    parser.add_argument("--framework", default="torch", help="comma list of torch, tf, mxnet (default torch)")
    for name in FRAMEWORKS:
        parser.add_argument(f"--python-{name}", default=sys.executable, metavar="PATH",
                            help=f"the python that runs the {name} job and its launcher (default: this one)")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    frameworks = parse_frameworks(args.framework, parser)
    patterns = [name.strip() for name in args.patterns.split(",") if name.strip()]
    if not patterns or any(name not in ("random", "fixed") for name in patterns):
        parser.error(f"--patterns {args.patterns!r}: a comma list of random, fixed")
    report = {"step_ms": args.step_ms, "slowdown": args.slowdown, "epochs": args.epochs, "frameworks": {}}
    for framework in frameworks:
        python = getattr(args, f"python_{framework}")
        if not os.access(python, os.X_OK):
            parser.error(f"--python-{framework} {python}: not an executable file")
    for framework in frameworks:
        python = getattr(args, f"python_{framework}")
        report["frameworks"][framework] = {"python": python, "patterns": {}}
        for pattern in patterns:
            report["frameworks"][framework]["patterns"][pattern] = run_pattern(framework, python, pattern, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


def run_pattern(framework: str, python: str, pattern: str, args: argparse.Namespace) -> Dict[str, object]:
    """The figures of one framework and straggler pattern: every configuration --repeats times, in turn."""
    runs: Dict[str, List[Dict[str, float]]] = {name: [] for name, _, _ in CONFIGS}
    for _ in range(args.repeats):
        for name, backup, skip in CONFIGS:
            runs[name].append(run_once(framework, python, pattern, backup, skip, args))
    figures: Dict[str, object] = {}
    for name, results in runs.items():
        figures[f"{name}_wall_s"] = statistics.median(r["wall_s"] for r in results)
        figures[f"{name}_accuracy"] = statistics.median(r["accuracy"] for r in results)
        figures[f"{name}_accuracies"] = sorted(r["accuracy"] for r in results)
    print(f"{framework:5} {pattern:6} straggler: " + "; ".join(
        f"{name} {figures[f'{name}_wall_s']:.2f} s ({figures['b0_wall_s'] / figures[f'{name}_wall_s']:.2f}x, "
        f"accuracy {figures[f'{name}_accuracy']:.3f}, "
        f"{min(figures[f'{name}_accuracies']):.3f}-{max(figures[f'{name}_accuracies']):.3f})"
        for name, _, _ in CONFIGS), flush=True)
    return figures


if __name__ == "__main__":
    main()
