"""broadcast_parameters, DistributedTrainer and DistributedOptimizer through real jobs.

scripts/training_checks.py trains a small CNN for 10 steps from per-rank
random weights, each of 2 workers on half of every batch, and compares with
the single-process run on whole batches it does itself (float32 tolerance).
"""

from __future__ import annotations

import os
import re

import pytest
from mxnet_jobs import launch_mxnet_job

from byteps.testkit import JOB_LAYOUTS, assert_all_ok, rank_lines

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")


@pytest.mark.parametrize("layout", JOB_LAYOUTS)
def test_training_under_bpslaunch(layout):
    check_training(JOB_LAYOUTS[layout])


def check_training(layout, env=None, ranks=2):
    """training_checks.py under ``layout``: every check passed, every equivalence within tolerance."""
    result = launch_mxnet_job(layout, os.path.join(SCRIPTS, "training_checks.py"), env=env)
    assert_all_ok(result, checks=8, ranks=ranks)
    for rank in range(ranks):
        reports = [line for line in rank_lines(result.stdout, rank) if "single-process reference" in line]
        assert len(reports) == 6, reports
        for report in reports:
            difference = float(re.search(r"reference (\S+)$", report).group(1))
            assert difference < (1e-3 if "fp16" in report else 1e-5), report
    return result
