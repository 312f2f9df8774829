"""TensorFlow's Adasum, compression, asynchronous, backup-worker and elastic jobs in the layouts the default run
leaves out (docs/horovod-compatibility.md, "Layouts"): two machines of two processes (``2x2``: ``-np 2 --workers 2
--servers 2``, 4 ranks, each machine's local sum through its root) and servers of their own
(``BYTEPS_ENABLE_IPC=0``: every payload over TCP; bpslaunch's summary line is checked to count no payload through
shared memory).

The worker scripts and the checks are the default run's, with the references taken over every rank:

* ``allreduce(op=Adasum)``, 2x2: ``test_ops_with_adasum_over_4_ranks`` (scripts/ops_checks.py, whose Adasum
  reference is Horovod's binary tree over every rank in numpy; its 4 MB tensor goes to the co-located servers
  through shared memory, which the summary must show);
* ``compression_params``, servers of their own (``--workers 2 --servers 2``):
  ``test_compression_with_servers_of_their_own`` (scripts/compression_checks.py against
  byteps.testkit.compression_reference, as tests/test_compression.py);
* async, 2x2 and servers of their own (2x2, IPC=0): ``test_async`` (scripts/async_training.py, rank 3 slow: machine
  0 never waits for machine 1, each machine's root pushes its ranks' summed deltas, the store ends at rank 0's
  initial weights plus every rank's every delta);
* backup workers, servers of their own (``--workers 3 --servers 2``, BYTEPS_BACKUP_WORKERS=1):
  ``test_backup_workers_with_servers_of_their_own`` (scripts/backup_training.py, as tests/test_backup_workers.py);
* elastic, servers of their own (``-np 3 --min-np 2 --servers 2``): ``test_elastic_with_servers_of_their_own``
  (scripts/elastic_training.py, a worker killed, the final value replayed for the job sizes it went through, as
  tests/test_elastic.py). The elastic summary line counts no payloads, so this job cannot show its path; its
  tensors (64 floats) are below the 64 KiB that shared memory takes anyway.
"""

from __future__ import annotations

import json
import pickle
import re
import subprocess

import numpy as np
import pytest
from test_backup_workers import SLEEP_S as BACKUP_SLEEP_S
from test_backup_workers import STEPS as BACKUP_STEPS
from test_backup_workers import assert_slow_worker_skipped
from test_compression import CASES as COMPRESSION_CASES
from test_compression import STEPS as COMPRESSION_STEPS
from test_compression import test_two_workers_match_the_reference_algorithm as check_compression_case
from test_elastic import custom_loop_survives_a_lost_worker
from tf_jobs import SCRIPTS, launch_tf_job

from byteps.testkit import assert_all_ok, free_port, rank_lines, report

TWO_BY_TWO = ["-np", "2", "--workers", "2", "--servers", "2"]
TCP = {"BYTEPS_ENABLE_IPC": "0"}


def summary(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("bpslaunch: job done in ")]
    assert len(lines) == 1, report(result)
    return lines[0]


def assert_no_shared_memory(result: subprocess.CompletedProcess) -> None:
    """BYTEPS_ENABLE_IPC=0: the job's summary counts no payload through shared memory to or from a server."""
    assert "shared memory" not in summary(result), report(result)


# --- allreduce(op=Adasum) -----------------------------------------------------------------------------------


def test_ops_with_adasum_over_4_ranks():
    result = launch_tf_job(TWO_BY_TWO, f"{SCRIPTS}/ops_checks.py", timeout=300)
    assert_all_ok(result, checks=14, ranks=4)
    for rank in range(4):
        info = [line for line in rank_lines(result.stdout, rank) if line.startswith("INFO")]
        assert info == [f"INFO rank={rank} size=4 local_rank={rank % 2} local_size=2"], info
    # Co-located servers: the 4 MB tensor's partitions went through shared memory.
    assert re.search(r"\d+ payloads through shared memory \(co-located servers\)", summary(result)), report(result)


# --- compression_params -------------------------------------------------------------------------------------


def test_compression_with_servers_of_their_own(tmp_path):
    result = launch_tf_job(["--workers", "2", "--servers", "2"], f"{SCRIPTS}/compression_checks.py",
                           [str(tmp_path), str(COMPRESSION_STEPS), json.dumps(COMPRESSION_CASES)],
                           env={"BYTEPS_MIN_COMPRESS_BYTES": "64", "MASTER_PORT": str(free_port()), **TCP},
                           timeout=300)
    assert_all_ok(result, checks=len(COMPRESSION_CASES) + 1)
    assert_no_shared_memory(result)
    records = {case: [np.load(tmp_path / f"{case}.rank{rank}.npz") for rank in range(2)]
               for case in COMPRESSION_CASES}
    for case, ranks in records.items():
        assert all(len(r["lr"]) == COMPRESSION_STEPS for r in ranks), report(result)
        check_compression_case(case, records)


# --- asynchronous training ----------------------------------------------------------------------------------

ASYNC_STEPS, ASYNC_SLEEP_S = 12, 0.3
#: layout: (the environment, how the script trains)
ASYNC_LAYOUTS = {"2x2": ({}, "tape"), "2x2-servers-of-their-own": (TCP, "fit")}


@pytest.mark.parametrize("layout", ASYNC_LAYOUTS)
def test_async(layout, tmp_path):
    env, mode = ASYNC_LAYOUTS[layout]
    result = launch_tf_job(TWO_BY_TWO, f"{SCRIPTS}/async_training.py",
                           [str(tmp_path), mode, str(ASYNC_STEPS), "3", str(ASYNC_SLEEP_S)],
                           env={"BYTEPS_ENABLE_ASYNC": "1", **env}, timeout=240)
    assert result.returncode == 0, report(result)
    if env:
        assert_no_shared_memory(result)
    ranks = []
    for r in range(4):
        with open(tmp_path / f"rank{r}.pkl", "rb") as saved:
            ranks.append(pickle.load(saved))
    spans = [rank["times"][-1] - rank["times"][0] for rank in ranks]
    # Rank 3 sleeps each step, so machine 1 is slow (rank 2 waits for it in the machine's local sum); machine 0
    # does not wait for machine 1.
    assert spans[3] >= (ASYNC_STEPS - 1) * ASYNC_SLEEP_S, ranks[3]["times"]
    for fast in spans[:2]:
        assert fast < 0.5 * spans[3], spans
    # One push per machine, key and step (each variable one key): the local root pushes its machine's sum.
    applied = int(re.search(r"servers applied (\d+) asynchronous pushes", summary(result)).group(1))
    keys = len(ranks[0]["names"])
    assert keys == 4, ranks[0]["names"]
    assert [rank["pushes"] for rank in ranks] == [(ASYNC_STEPS + 1) * keys] * 4, [rank["pushes"] for rank in ranks]
    assert applied == 2 * (ASYNC_STEPS + 1) * keys, applied
    # The store = rank 0's initial weights + every delta of every rank, on every rank (which began apart).
    assert any(not np.allclose(ranks[3]["initial"][name], ranks[0]["initial"][name]) for name in ranks[0]["names"])
    for name in ranks[0]["names"]:
        expected = ranks[0]["initial"][name] + sum(rank["deltas"][name] for rank in ranks)
        for r, rank in enumerate(ranks):
            np.testing.assert_allclose(rank["final"][name], expected, rtol=0, atol=1e-5, err_msg=f"{name} rank {r}")


# --- backup workers -----------------------------------------------------------------------------------------


def test_backup_workers_with_servers_of_their_own():
    """3 machines of one process, b = 1, two servers, every payload over TCP: every update the average of exactly
    two ranks' gradients of that step, the same on every rank, the slow worker computing about half the steps."""
    result = launch_tf_job(["--workers", "3", "--servers", "2"], f"{SCRIPTS}/backup_training.py",
                           ["function", str(BACKUP_STEPS), str(BACKUP_SLEEP_S)],
                           env={"BYTEPS_BACKUP_WORKERS": "1", **TCP}, timeout=240)
    assert result.returncode == 0, report(result)
    assert_no_shared_memory(result)
    found = [json.loads(line) for line in re.findall(r"RESULT (\{.*\})", result.stdout)]
    ranks = {r["rank"]: r for r in found}
    assert sorted(ranks) == [0, 1, 2], report(result)
    assert_slow_worker_skipped(ranks)


# --- elastic ------------------------------------------------------------------------------------------------


def test_elastic_with_servers_of_their_own():
    """tests/test_elastic.py's custom loop (gradients from a tf.function) with two servers over TCP: 3 workers, one
    SIGKILLed at step 3; the other two go on and end on the value replayed for the job sizes they report."""
    output = custom_loop_survives_a_lost_worker("tape", extra_env=TCP, extra_launch=["--servers", "2"])
    assert re.search(r"elastic job: 3 worker\(s\) to start, .* 2 server\(s\) per membership epoch", output), \
        output[-6000:]
    assert "worker w2 was killed by SIGKILL (signal 9); going on with 2 worker(s)" in output, output[-6000:]
