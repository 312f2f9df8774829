"""Backup workers in torch training (docs/async.md): a slow worker skips the rounds that closed without it."""

import json
import os
import re

from byteps.testkit import launch_job

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "backup_training.py")
STEPS, SLEEP_S = 16, 0.25


def results(env, layout=("--workers", "3", "--servers", "1")):
    result = launch_job(list(layout), SCRIPT, [str(STEPS), str(SLEEP_S)], env=env, timeout=120)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    found = [json.loads(line) for line in re.findall(r"RESULT (\{.*\})", result.stdout)]
    return {r["rank"]: r for r in found}


def test_the_slow_worker_skips_closed_rounds_and_every_replica_stays_identical():
    ranks = results({"BYTEPS_BACKUP_WORKERS": "1"})
    assert len(ranks) == 3
    assert ranks[0]["parameters"] == ranks[1]["parameters"] == ranks[2]["parameters"], ranks
    assert ranks[0]["computed"] == ranks[1]["computed"] == STEPS
    slow = ranks[2]
    # It computed only the rounds it could still join, so it did not take STEPS x SLEEP_S = 4 s.
    assert slow["computed"] <= STEPS // 2, slow
    assert slow["seconds"] < 0.6 * STEPS * SLEEP_S, slow


def test_without_backup_workers_nothing_is_skipped():
    ranks = results({})
    assert all(r["computed"] == STEPS for r in ranks.values()), ranks
    assert ranks[0]["parameters"] == ranks[2]["parameters"]
    assert ranks[2]["seconds"] >= STEPS * SLEEP_S


def test_with_two_processes_per_machine_the_slow_machine_skips_together():
    """The machine is what is late: its local root's push is the machine's, and every local rank learns from
    the root's answers how far behind the machine is, so both ranks skip the same rounds."""
    ranks = results({"BYTEPS_BACKUP_WORKERS": "1"}, ("-np", "2", "--workers", "3", "--servers", "1"))
    assert len(ranks) == 6
    assert all(r["parameters"] == ranks[0]["parameters"] for r in ranks.values()), ranks
    assert all(ranks[r]["computed"] == STEPS for r in range(4))
    assert ranks[4]["computed"] == ranks[5]["computed"] <= STEPS // 2, (ranks[4], ranks[5])
    assert max(ranks[4]["seconds"], ranks[5]["seconds"]) < 0.6 * STEPS * SLEEP_S, (ranks[4], ranks[5])
