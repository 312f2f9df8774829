"""Backup workers with two processes per machine: the machine is what is late, and it skips as one.

Real jobs (scheduler, server, 3 machines x 2 worker processes on 127.0.0.1),
the sums decoded against what each machine pushed (backup_local_worker.py).
"""

from __future__ import annotations

import os
import re
import sys

from byteps.testkit import run_job

WORKER = [sys.executable, os.path.join(os.path.dirname(__file__), "backup_local_worker.py")]
ROUNDS = 12


def rounds_seen(output):
    return [(int(r), int(t), (int(a), int(b)), bool(skipped))
            for r, t, a, b, skipped in re.findall(r"ROUND (\d+) GOT (\d+) MACHINES (\d),(\d)( SKIPPED)?", output)]


def test_the_slow_machine_skips_together_and_every_process_applies_the_same_sums():
    result = run_job(WORKER + [str(ROUNDS), "0.3"], 3, 1, local_size=2, env={"BYTEPS_BACKUP_WORKERS": "1"},
                     timeout=90)
    assert not result.timed_out and all(code == 0 for code in result.codes.values()), result.failures()
    seen = {rank: rounds_seen(result.outputs[f"worker{rank}"]) for rank in range(6)}
    sums = {rank: [(r, t, m) for r, t, m, _ in lines] for rank, lines in seen.items()}
    assert all(len(lines) == ROUNDS for lines in seen.values()), seen
    # Every process applies the same sequence: each round's sum holds two machines' pushes of that round.
    assert all(sums[rank] == sums[0] for rank in range(6)), sums
    assert all(t == r for r, t, _ in sums[0]), sums[0]
    # The slow machine's two processes skipped the same rounds, a good share of them: the machine, not a
    # process, is what is late; a round it skipped had closed with the two fast machines.
    assert all(m == (0, 1) for _, _, m, s in seen[4] if s), seen[4]
    skipped = [[s for _, _, _, s in seen[rank]] for rank in (4, 5)]
    assert skipped[0] == skipped[1] and sum(skipped[0]) >= ROUNDS // 3, skipped
    assert not any(s for rank in range(4) for _, _, _, s in seen[rank])
