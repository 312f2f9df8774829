"""Row-sparse push_pull through real scheduler, servers and workers on 127.0.0.1 (docs/sparse.md).

Each job runs sparse_worker.py in its worker processes (one per machine,
or several: the table's local root sums its machine's rows first):
random ids with duplicates and empty inputs, checked against numpy on
every rank; and each bad input, which must fail where it should, within
seconds, and leave the servers serving the next round.
"""

import os
import sys

import numpy as np
import pytest

from byteps.common import Config, SparseRows, Worker
from byteps.testkit import run_job

WORKER = [sys.executable, os.path.join(os.path.dirname(__file__), "sparse_worker.py")]


@pytest.mark.parametrize("workers,servers", [(2, 1), (2, 2), (3, 1), (3, 2)])
def test_sparse_rows_are_summed_by_id_over_every_worker(workers, servers):
    result = run_job([*WORKER, "sums", "5"], workers, servers, timeout=90)
    result.assert_workers_printed("SPARSE OK", workers)


def test_sparse_rows_over_tcp_alone_with_server_scheduling_and_a_trace(tmp_path):
    """No shared memory between the processes (the other jobs use it), pushes handled in key order on the
    servers, and every stage traced."""
    env = {"BYTEPS_ENABLE_IPC": "0", "BYTEPS_SERVER_ENABLE_SCHEDULE": "1", "BYTEPS_TRACE_ON": "1",
           "BYTEPS_TRACE_DIR": str(tmp_path), "BYTEPS_TRACE_START_STEP": "1", "BYTEPS_TRACE_END_STEP": "3"}
    result = run_job([*WORKER, "sums", "3"], 2, 2, timeout=90, env=env)
    result.assert_workers_printed("SPARSE OK", 2)
    traces = "".join(path.read_text() for path in tmp_path.rglob("comm.json"))
    assert '"cat": "sparse_exchange"' in traces and '"cat": "sparse_merge"' in traces, traces[:2000]


def test_several_worker_processes_per_machine_sum_their_rows_before_they_leave_it():
    """2 machines of 2 worker processes: each table's local root sums its machine's rows by id and pushes that
    sum alone (a rank that is not the root sends the servers nothing), over TCP and through shared memory to a
    co-located server alike."""
    for env in ({"BYTEPS_ENABLE_IPC": "0"}, {}):
        result = run_job([*WORKER, "sums", "3"], 2, 2, local_size=2, timeout=90, env=env)
        result.assert_workers_printed("SPARSE OK", 4)


@pytest.mark.parametrize("local_size", [2, 3])
def test_one_machine_without_servers_sums_its_ranks_rows(local_size):
    """No servers: the table's local root sums every rank's rows, and that sum (averaged where asked) is the
    round's result on every rank."""
    result = run_job([*WORKER, "sums", "3"], 1, 0, local_size=local_size, timeout=90)
    result.assert_workers_printed("SPARSE OK", local_size)


@pytest.mark.parametrize("layout", ["one-machine-of-3", "two-machines-of-2"])
def test_ranks_that_join_count_as_no_rows_and_a_joined_root_stands_in(layout):
    """hvd.join() after row-sparse rounds with several processes per machine: ranks run out of data at
    different rounds; a root counts a joined rank as no rows, a joined root sums its peers' rows for them
    (and pushes the machine's sum), a machine whose ranks all joined is an empty push at the servers; averages
    divide by every rank. After the join one more round on every rank agrees."""
    workers, servers, local_size = (1, 0, 3) if layout == "one-machine-of-3" else (2, 2, 2)
    result = run_job([*WORKER, "joined", "7"], workers, servers, local_size=local_size, timeout=90)
    result.assert_workers_printed("JOINED OK", workers * local_size)


@pytest.mark.parametrize("case", ["out_of_range", "row_shape", "disagree"])
def test_bad_sparse_input_of_a_local_rank_fails_its_round_on_every_rank(case):
    """2 machines of 2: a rank's bad input (a peer's or a root's, whichever the culprit is of the table) or a
    disagreement inside a machine fails the round on every rank, and the next round is whole."""
    result = run_job([*WORKER, "bad", case], 2, 2, local_size=2, timeout=60)
    result.assert_workers_printed("BAD OK", 4)


def test_rounds_larger_than_a_message_go_in_parts():
    result = run_job([*WORKER, "large", "2"], 2, 2, timeout=120, env={"BYTEPS_ENABLE_IPC": "0"})
    result.assert_workers_printed("LARGE OK", 2)


@pytest.mark.parametrize("case", ["out_of_range", "negative", "dtype", "row_shape", "first_use", "reused",
                                  "disagree"])
def test_bad_sparse_input_fails_its_round_everywhere_and_the_servers_go_on(case):
    result = run_job([*WORKER, "bad", case], 2, 2, timeout=60)
    result.assert_workers_printed("BAD OK", 2)


def test_one_rank_of_three_that_declares_a_table_otherwise_fails_the_round_on_every_rank():
    """Whichever rank declares first, the ranks that agreed with it learn of the mismatch too (relayed)."""
    for _ in range(2):  # the order of declarations varies between runs
        result = run_job([*WORKER, "bad", "one_disagrees"], 3, 2, timeout=60)
        result.assert_workers_printed("BAD OK", 3)


def test_a_single_worker_process_sums_its_own_rows(monkeypatch):
    for variable in [v for v in os.environ if v.startswith(("DMLC_", "BYTEPS_"))]:
        monkeypatch.delenv(variable)
    worker = Worker(Config.from_env())
    try:
        result = worker.sparse_push_pull(np.array([5, 2, 5]), np.arange(6, dtype=np.float32).reshape(3, 2), "t",
                                         10, (2,), average=True)
        assert isinstance(result, SparseRows)
        ids, rows = result
        assert ids.tolist() == [2, 5] and rows.tolist() == [[2, 3], [4, 6]]
        with pytest.raises(ValueError, match=r"row ids must lie in \[0, 10\); got 10, -1"):
            worker.sparse_push_pull(np.array([10, -1]), np.zeros((2, 2), np.float32), "t", 10, (2,))
        with pytest.raises(ValueError, match="the name was first used for"):
            worker.sparse_push_pull(np.array([1]), np.zeros((1, 3), np.float32), "t", 10, (3,))
    finally:
        worker.shutdown()
