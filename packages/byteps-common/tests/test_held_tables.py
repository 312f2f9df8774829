"""Tables held by the servers through real scheduler, servers and workers on 127.0.0.1 (docs/sparse.md).

Each job runs held_worker.py: rows looked up by id and stepped by the
servers' optimizer round by round, checked on every rank against a numpy
table kept in the worker; bad calls fail where they should and the
servers go on serving.
"""

import os
import sys

import numpy as np
import pytest

from byteps.common.held_table import HeldTable, initial_rows
from byteps.testkit import run_job

WORKER = [sys.executable, os.path.join(os.path.dirname(__file__), "held_worker.py")]


@pytest.mark.parametrize("optimizer,workers,servers", [("sgd", 2, 1), ("adagrad", 2, 2), ("adam", 3, 2)])
def test_a_held_table_is_stepped_by_the_servers_optimizer(optimizer, workers, servers):
    result = run_job([*WORKER, "train", "5", optimizer], workers, servers, timeout=90)
    result.assert_workers_printed("HELD OK", workers)


def test_several_processes_per_machine_update_a_held_table_once_per_machine():
    """2 machines of 2 processes: the table's local root sums its machine's gradients, each process looks up
    its own rows; over TCP and through shared memory alike."""
    for env in ({"BYTEPS_ENABLE_IPC": "0"}, {}):
        result = run_job([*WORKER, "train", "4", "adam"], 2, 2, local_size=2, timeout=90, env=env)
        result.assert_workers_printed("HELD OK", 4)


@pytest.mark.parametrize("case", ["out_of_range", "disagree", "held_then_not"])
def test_bad_calls_on_a_held_table_fail_and_the_servers_go_on(case):
    result = run_job([*WORKER, "bad", case], 2, 2, timeout=60)
    result.assert_workers_printed("BAD OK", 2)


def test_rows_start_from_the_seed_and_the_id_alone():
    held = HeldTable(seed=5, init_std=0.5)
    both = initial_rows(held, np.array([9, 123456789]), 16)
    assert both.dtype == np.float32 and both.shape == (2, 16)
    np.testing.assert_array_equal(initial_rows(held, np.array([123456789]), 16)[0], both[1])
    assert not np.array_equal(initial_rows(HeldTable(seed=6, init_std=0.5), np.array([9]), 16)[0], both[0])
    many = initial_rows(held, np.arange(20000), 8)
    assert abs(many.mean()) < 0.01 and abs(many.std() - 0.5) < 0.01
    assert not initial_rows(HeldTable(init_std=0), np.array([1]), 4).any()


def test_a_held_tables_settings_are_checked():
    with pytest.raises(ValueError, match="optimizer 'rmsprop'"):
        HeldTable(optimizer="rmsprop")
    with pytest.raises(ValueError, match="lr"):
        HeldTable(lr=-1)
    with pytest.raises(ValueError, match="unknown settings"):
        HeldTable.from_wire({"optimizer": "sgd", "momentum": 0.9})
    held = HeldTable("adam", lr=0.1, betas=(0.5, 0.6))
    assert HeldTable.from_wire(held.wire()) == held
