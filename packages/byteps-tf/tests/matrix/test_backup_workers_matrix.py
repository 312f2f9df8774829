"""Backup workers (BYTEPS_BACKUP_WORKERS=1, 3 workers, 1 server, the last one slow) where the default run has no test
(or leaves out for CI time): a plain loop run eagerly with ``bps.skip_step``; in a TF1 graph (a tape with
``bps.skip_step(optimizer, variables, session)``, and the TF1 ``DistributedOptimizer``'s ``skip_step(session)``),
that optimizer's ``skip_step()`` eagerly, and Keras 2's ``model.fit`` with ``SkipStepCallback``
(TF_USE_LEGACY_KERAS=1). Same job and checks as tests/test_backup_workers.py: every update the average of exactly
two ranks' gradients of that step, the same updates on every rank, the slow worker computing about half the steps.
"""

from __future__ import annotations

import pytest
from test_backup_workers import assert_slow_worker_skipped, results

MODES = {"eager": {}, "tf1-tape": {}, "tf1-optimizer": {}, "optimizer-eager": {}, "fit": {"TF_USE_LEGACY_KERAS": "1"}}


@pytest.mark.parametrize("mode", list(MODES),
                         ids=["eager", "tf1-graph-tape", "tf1-graph-optimizer", "tf1-optimizer-eager", "keras2-fit"])
def test_the_slow_worker_skips_closed_rounds(mode):
    ranks = results(mode, {"BYTEPS_BACKUP_WORKERS": "1", **MODES[mode]})
    assert_slow_worker_skipped(ranks)
