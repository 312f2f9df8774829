"""Tables held by the servers through real scheduler, servers and workers on 127.0.0.1 (docs/sparse.md).

Each job runs held_worker.py: rows looked up by id and stepped by the
servers' optimizer round by round, checked on every rank against a numpy
table kept in the worker; bad calls fail where they should and the
servers go on serving.
"""

import json
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


def test_a_saved_table_resumes_on_another_number_of_servers(tmp_path):
    """A job saves its table (rows and Adam's per-row state) before round 2 of 5 on 2 servers; another job loads
    it onto 3 servers and runs rounds 2 to 5: both end with the same rows. A load that finds no whole save
    fails at the call."""
    def final(result) -> np.ndarray:
        line = next(line for line in result.outputs["worker0"].splitlines() if line.startswith("FINAL "))
        return np.array(json.loads(line[len("FINAL "):]))

    saved = run_job([*WORKER, "save", str(tmp_path), "5", "2"], 2, 2, timeout=90)
    saved.assert_workers_printed("HELD OK", 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb.held.server0-of-2.npz", "emb.held.server1-of-2.npz"]
    resumed = run_job([*WORKER, "resume", str(tmp_path), "5", "2"], 2, 3, timeout=90)
    resumed.assert_workers_printed("HELD OK", 2)
    np.testing.assert_allclose(final(resumed), final(saved), rtol=1e-6, atol=1e-7)
    (tmp_path / "emb.held.server1-of-2.npz").unlink()
    broken = run_job([*WORKER, "resume", str(tmp_path), "5", "2"], 2, 2, timeout=60)
    assert broken.codes["worker0"] != 0 and "one whole save expected" in broken.outputs["worker0"], broken.failures()


def test_an_asynchronous_held_table_applies_every_push_once_on_arrival():
    """BYTEPS_ENABLE_ASYNC=1: each process's update is stepped when it arrives (a slow rank holds nobody back)
    and every push exactly once, not averaged; 2 workers, and 2 machines of 2 processes (each pushing its own)."""
    for local_size in (1, 2):
        result = run_job([*WORKER, "async", "12"], 2, 2, local_size=local_size, timeout=90,
                         env={"BYTEPS_ENABLE_ASYNC": "1"})
        result.assert_workers_printed("ASYNC OK", 2 * local_size)


def test_an_asynchronous_held_table_keeps_its_staleness_bound():
    """BYTEPS_ASYNC_MAX_STALENESS=1: a fast rank's update is answered only once the slow rank is at most one
    round behind (checked on every rank after every update through each rank's marker row)."""
    result = run_job([*WORKER, "async", "10", "1"], 3, 2, timeout=90,
                     env={"BYTEPS_ENABLE_ASYNC": "1", "BYTEPS_ASYNC_MAX_STALENESS": "1"})
    result.assert_workers_printed("ASYNC OK", 3)


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
