"""``DistributedOptimizer(op=Adasum)`` with 4 workers on one machine (``-np 4``: Adasum's tree two levels
deep), against numpy's Adasum of every rank's parameter delta: the default run's test_adasum_optimizer.py
job, with 1 and 2 workers there."""

from __future__ import annotations

from test_adasum_optimizer import SCRIPT, TRAINING_CHECKS

from byteps.testkit import assert_all_ok, launch_job


def test_adasum_training_with_four_workers():
    result = launch_job(["-np", "4"], SCRIPT, timeout=240)
    assert_all_ok(result, checks=TRAINING_CHECKS, ranks=4)
