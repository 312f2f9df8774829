"""Backup workers in torch training (docs/async.md): a slow worker skips the rounds that closed without it."""

import json
import os
import re

from byteps.testkit import launch_job

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "backup_training.py")
STEPS, SLEEP_S = 16, 0.25


def results(env):
    result = launch_job(["--workers", "3", "--servers", "1"], SCRIPT, [str(STEPS), str(SLEEP_S)], env=env,
                        timeout=120)
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
