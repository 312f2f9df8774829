"""Horovod's collectives beyond allreduce, through real jobs (scripts/collectives_checks.py).

The two usual layouts, and four ranks on two machines of two, where the
process-set checks span machines and a rank outside a set proves that the
set never waits for it.
"""

from __future__ import annotations

import os

import pytest

from byteps.testkit import JOB_LAYOUTS, assert_all_ok, launch_job

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")
CHECKS = 14


@pytest.mark.parametrize("layout", JOB_LAYOUTS)
def test_collectives_under_bpslaunch(layout, tmp_path):
    result = launch_job(JOB_LAYOUTS[layout], os.path.join(SCRIPTS, "collectives_checks.py"),
                        env={"BYTEPS_TEST_TMP": str(tmp_path)})
    assert_all_ok(result, checks=CHECKS)


def test_collectives_on_four_ranks_of_two_machines(tmp_path):
    marker = tmp_path / "members-finished"
    result = launch_job(["--workers", "2", "-np", "2", "--servers", "1"],
                        os.path.join(SCRIPTS, "collectives_checks.py"),
                        env={"OUTSIDER_FILE": str(marker), "BYTEPS_TEST_TMP": str(tmp_path)}, timeout=180)
    assert_all_ok(result, checks=CHECKS, ranks=4)
    assert marker.exists()
