"""Broadcast of tensors, parameters, optimizer state and objects through real jobs (scripts/broadcast_checks.py)."""

from __future__ import annotations

import os

import pytest

from byteps.testkit import JOB_LAYOUTS, assert_all_ok, launch_job

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


@pytest.mark.parametrize("layout", JOB_LAYOUTS)
def test_broadcasts_under_bpslaunch(layout):
    result = launch_job(JOB_LAYOUTS[layout], os.path.join(SCRIPTS, "broadcast_checks.py"))
    assert_all_ok(result, checks=6)
