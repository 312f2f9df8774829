"""Backup workers in TensorFlow (docs/async.md): a slow worker skips the rounds that closed without it.

Runs scripts/backup_training.py under the real bpslaunch with 3 workers,
1 server and BYTEPS_BACKUP_WORKERS=1, the last worker sleeping in every
batch it computes, in the ways TensorFlow trains: the step of a loop with
``bps.skip_step`` in a ``tf.function``, and Keras ``model.fit`` with
``SkipStepCallback`` (the same loop run eagerly, TF1 graphs and Keras 2:
matrix/test_backup_workers_matrix.py). Each rank's gradient at step k is
``(k + 1) * e_rank``, so every update the ranks applied tells which ranks'
pushes made its round and for which step: each must be the average of
exactly two ranks' gradients of that step, and every rank must have
applied the same updates.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from tf_jobs import SCRIPTS, launch_tf_job

from byteps.testkit import report

STEPS, SLEEP_S, LR = 12, 0.3, 0.01


def results(mode, env):
    result = launch_tf_job(["--workers", "3", "--servers", "1"], f"{SCRIPTS}/backup_training.py",
                           [mode, str(STEPS), str(SLEEP_S)], env=env, timeout=240)
    assert result.returncode == 0, report(result)
    found = [json.loads(line) for line in re.findall(r"RESULT (\{.*\})", result.stdout)]
    assert len(found) == 3, report(result)
    return {r["rank"]: r for r in found}


def assert_slow_worker_skipped(ranks):
    """Ranks 0 and 1 applied the same STEPS updates as the slow rank 2, each round of exactly two ranks'
    gradients; rank 2 computed only the rounds it could still join, so steps 2..STEPS did not take
    (STEPS - 1) x SLEEP_S."""
    assert ranks[0]["trajectory"] == ranks[1]["trajectory"] == ranks[2]["trajectory"], ranks
    assert len(ranks[0]["trajectory"]) == STEPS
    assert all(len(made) == 2 for made in rounds_of(ranks[0]["trajectory"])), rounds_of(ranks[0]["trajectory"])
    assert ranks[0]["computed"] == ranks[1]["computed"] == STEPS
    slow = ranks[2]
    assert slow["computed"] <= STEPS // 2, slow
    assert slow["seconds"] < 0.6 * (STEPS - 1) * SLEEP_S, slow


def rounds_of(trajectory):
    """Each step's update as (the ranks whose gradients made it, the step they computed it for)."""
    weights = np.array([[0.0] * 3, *trajectory], np.float64)
    decoded = []
    for k, update in enumerate((weights[:-1] - weights[1:]) / LR):
        ranks = tuple(int(i) for i in np.flatnonzero(np.abs(update) > 1e-3))
        assert ranks, (k, update)
        np.testing.assert_allclose(update[list(ranks)], (k + 1) / len(ranks), rtol=1e-4, err_msg=f"step {k}")
        decoded.append(ranks)
    return decoded


@pytest.mark.parametrize("mode", ["function", "fit"])
def test_the_slow_worker_skips_closed_rounds_and_every_replica_applies_the_same_averages(mode):
    ranks = results(mode, {"BYTEPS_BACKUP_WORKERS": "1"})
    assert_slow_worker_skipped(ranks)


def test_without_backup_workers_nothing_is_skipped():
    ranks = results("function", {})
    assert all(r["computed"] == STEPS for r in ranks.values()), ranks
    assert ranks[0]["trajectory"] == ranks[2]["trajectory"]
    assert rounds_of(ranks[0]["trajectory"]) == [(0, 1, 2)] * STEPS
    assert ranks[2]["seconds"] >= (STEPS - 1) * SLEEP_S
