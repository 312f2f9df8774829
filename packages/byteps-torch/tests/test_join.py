"""hvd.join() for uneven data through real jobs (scripts/join_checks.py), in the usual layouts: one machine of
two ranks (summed in shared memory), two machines with servers, and BytePS's own: two machines of two processes
each with servers (a joined local root stands in for its peer), also with backup workers."""

from __future__ import annotations

import os

import pytest

from byteps.testkit import JOB_LAYOUTS, assert_all_ok, launch_job

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


@pytest.mark.parametrize("layout", JOB_LAYOUTS)
def test_join_with_uneven_data(layout):
    result = launch_job(JOB_LAYOUTS[layout], os.path.join(SCRIPTS, "join_checks.py"))
    assert_all_ok(result, checks=4)


TWO_BY_TWO = ["-np", "2", "--workers", "2", "--servers", "2"]


def test_join_with_uneven_data_on_two_machines_of_two_processes():
    result = launch_job(TWO_BY_TWO, os.path.join(SCRIPTS, "join_checks.py"))
    assert_all_ok(result, checks=4, ranks=4)


def test_join_with_backup_workers_on_two_machines_of_two_processes():
    """Rounds close at one machine's push; a machine whose ranks all joined holds nobody back."""
    result = launch_job(TWO_BY_TWO, os.path.join(SCRIPTS, "join_checks.py"), ["--backup"],
                        env={"BYTEPS_BACKUP_WORKERS": "1"})
    assert_all_ok(result, checks=2, ranks=4)
