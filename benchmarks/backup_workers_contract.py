"""What bench_backup_workers.py and each framework's job agree on, written once.

Every job (``backup_workers_job.py`` for torch, ``backup_workers_job_<framework>.py``
for the others) takes the same options, emulates the same compute per step
(a sleep, the step's straggler --slowdown times longer) and prints the same
JSON line per rank, which the bench reads.
"""

from __future__ import annotations

import argparse
import json
import random
import time


def parse_args(description: str) -> argparse.Namespace:
    """The options every job takes: --epochs, --step-ms, --slowdown, --straggler random|fixed, --skip."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--slowdown", type=float, default=3.0)
    parser.add_argument("--straggler", choices=("random", "fixed"), default="random")
    parser.add_argument("--skip", action="store_true", help="skip the rounds that closed without this worker")
    return parser.parse_args()


def emulate_compute(step: int, rank: int, size: int, args: argparse.Namespace) -> None:
    """Sleep for one step's compute; the step's straggler (from the step number, the same on every rank, or
    always the last rank) sleeps --slowdown times as long."""
    straggler = random.Random(step).randrange(size) if args.straggler == "random" else size - 1
    time.sleep(args.step_ms / 1000 * (args.slowdown if rank == straggler else 1.0))


def report(rank: int, wall_s: float, accuracy: float, steps: int, computed: int, checksum: float) -> None:
    """The one JSON line per rank that bench_backup_workers.py reads."""
    print(json.dumps({"rank": rank, "wall_s": wall_s, "accuracy": accuracy, "steps": steps, "computed": computed,
                      "checksum": checksum}), flush=True)
