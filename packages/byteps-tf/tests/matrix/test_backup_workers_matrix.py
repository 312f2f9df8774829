"""Backup workers (BYTEPS_BACKUP_WORKERS=1, 3 workers, 1 server, the last one slow) where the default
run has no test: in a TF1 graph (a tape with ``bps.skip_step(optimizer, variables, session)``, and the
TF1 ``DistributedOptimizer``'s ``skip_step(session)``), that optimizer's ``skip_step()`` eagerly, and
Keras 2's ``model.fit`` with ``SkipStepCallback`` (TF_USE_LEGACY_KERAS=1). Same job and checks as
tests/test_backup_workers.py: every update the average of exactly two ranks' gradients of that step,
the same updates on every rank, the slow worker computing about half the steps.
"""

from __future__ import annotations

import pytest
from test_backup_workers import SLEEP_S, STEPS, results, rounds_of

MODES = {"tf1-tape": {}, "tf1-optimizer": {}, "optimizer-eager": {}, "fit": {"TF_USE_LEGACY_KERAS": "1"}}


@pytest.mark.parametrize("mode", list(MODES),
                         ids=["tf1-graph-tape", "tf1-graph-optimizer", "tf1-optimizer-eager", "keras2-fit"])
def test_the_slow_worker_skips_closed_rounds(mode):
    ranks = results(mode, {"BYTEPS_BACKUP_WORKERS": "1", **MODES[mode]})
    assert ranks[0]["trajectory"] == ranks[1]["trajectory"] == ranks[2]["trajectory"], ranks
    assert len(ranks[0]["trajectory"]) == STEPS
    assert all(len(made) == 2 for made in rounds_of(ranks[0]["trajectory"])), rounds_of(ranks[0]["trajectory"])
    assert ranks[0]["computed"] == ranks[1]["computed"] == STEPS
    slow = ranks[2]
    assert slow["computed"] <= STEPS // 2, slow
    assert slow["seconds"] < 0.6 * (STEPS - 1) * SLEEP_S, slow
