"""Row-sparse gradients on 2 machines of 2 worker processes: the table's local root sums its machine's rows
(docs/sparse.md); the default run's test_sparse_training.py job in a layout it lacks (torch runs it by
default)."""

from __future__ import annotations

from test_sparse_training import SCRIPT
from tf_jobs import launch_tf_job

from byteps.testkit import assert_all_ok


def test_two_machines_of_two_processes_go_row_sparse():
    args = ["-np", "2", "--workers", "2", "--servers", "2"]
    assert_all_ok(launch_tf_job(args, SCRIPT, ["row-sparse"]), checks=6, ranks=4)
