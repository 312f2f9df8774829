"""hvd.join() for uneven data through real jobs (scripts/join_checks.py), in both usual layouts:
one machine of two ranks (summed in shared memory) and two machines with servers."""

from __future__ import annotations

import os

import pytest

from byteps.testkit import JOB_LAYOUTS, assert_all_ok, launch_job

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


@pytest.mark.parametrize("layout", JOB_LAYOUTS)
def test_join_with_uneven_data(layout):
    result = launch_job(JOB_LAYOUTS[layout], os.path.join(SCRIPTS, "join_checks.py"))
    assert_all_ok(result, checks=4)
