"""byteps.torch's capabilities in the layouts the default tests leave out (docs/horovod-compatibility.md, "Layouts").

Two layouts, each a real job under bpslaunch (scheduler, servers, workers):

* ``2x2``: two machines of two worker processes, two servers on the workers' host
  (``-np 2 --workers 2 --servers 2``): each machine's ranks sum in shared memory, its local root pushes,
  payloads of 64 KiB and more go to the co-located servers through shared memory;
* ``tcp``: the same with ``BYTEPS_ENABLE_IPC=0``, every payload over TCP, as with servers on hosts of
  their own (backup workers: 3 machines of one process, ``--workers 3 --servers 2``; elastic: ``-np 3
  --min-np 2 --servers 2``, each worker a machine of its own). The summary line of bpslaunch must show no
  payload through shared memory. The join, async, backup-workers and DistributedOptimizer jobs move
  payloads of 64 KiB and more (the async ``2x2`` job is checked to send them through shared memory); the
  compression, SyncBatchNorm and DDP jobs move only smaller ones, which go over TCP in both layouts.

The cells, one test each (parametrized by layout where the row has both):

* allreduce Adasum, 2x2: ``test_adasum`` (scripts/adasum_optimizer_checks.py: allreduce(op=Adasum) and
  DistributedOptimizer(op=Adasum), 4 ranks, against a numpy Adasum tree over every rank);
* join, tcp: ``test_join`` (scripts/join_checks.py, 4 ranks);
* compression_params, tcp: ``test_compression`` (scripts/compression_training.py, 4 ranks, against
  byteps.testkit.compression_reference with each machine's local sum compressed);
* async, 2x2 and tcp: ``test_async`` (scripts/async_training.py: a slow machine, the fast one never waits,
  every delta applied once);
* backup workers, tcp: ``test_backup_workers`` (scripts/backup_training.py, 3 machines, b = 1);
* elastic, 2x2: ``test_elastic_refuses_several_processes_per_machine`` (refused at launch: an elastic
  job's workers are machines of one process each); tcp: ``test_elastic_over_tcp`` (the digits example
  loses a worker to SIGKILL and finishes with the other two);
* SyncBatchNorm, 2x2 and tcp: ``test_sync_batch_norm`` (scripts/sync_batch_norm_checks.py, 4 ranks);
* gradient wrappers, tcp: ``test_optimizer`` and ``test_parallel`` (scripts/optimizer_checks.py,
  scripts/parallel_checks.py: DistributedOptimizer and DDP, 4 ranks).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from job_checks import SCRIPTS
from test_backup_workers import SLEEP_S as BACKUP_SLEEP_S
from test_backup_workers import STEPS as BACKUP_STEPS
from test_backup_workers import check_rounds, recorded
from test_compression import STEPS as COMPRESSION_STEPS
from test_compression import _check_weight

from byteps.testkit import LAUNCHER, WatchedJob, assert_all_ok, clean_env, free_port, launch_job, rank_lines, report
from byteps.testkit.compression_reference import ReferenceJob, uncompressed_rounds

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "examples", "torch")

TWO_BY_TWO = ["-np", "2", "--workers", "2", "--servers", "2"]
TCP = {"BYTEPS_ENABLE_IPC": "0"}
LAYOUTS = {"2x2": {}, "tcp": TCP}  # both on two machines of two processes; tcp: every payload over TCP


def script(name: str) -> str:
    return os.path.join(SCRIPTS, name)


def assert_layout(result: subprocess.CompletedProcess, env: dict, large: bool = False) -> None:
    """bpslaunch's summary: with BYTEPS_ENABLE_IPC=0 no payload went through shared memory to a server; with
    co-located servers and ``large`` payloads (64 KiB and more) some did."""
    if env.get("BYTEPS_ENABLE_IPC") == "0":
        assert "payloads through shared memory" not in result.stderr, report(result)
    elif large:
        assert re.search(r"\d+ payloads through shared memory \(co-located servers\)", result.stderr), report(result)


# --- allreduce Adasum, DistributedOptimizer(op=Adasum) ------------------------------------------------------


def test_adasum():
    """4 ranks, every one a leaf of Horovod's (CPU) Adasum tree."""
    result = launch_job(TWO_BY_TWO, script("adasum_optimizer_checks.py"), timeout=240)
    assert_all_ok(result, checks=10, ranks=4)
    assert_layout(result, {}, large=True)  # the 80 KB tensor's gather went to the servers through shared memory


# --- join ---------------------------------------------------------------------------------------------------


def test_join():
    result = launch_job(TWO_BY_TWO, script("join_checks.py"), env=TCP, timeout=180)
    assert_all_ok(result, checks=4, ranks=4)
    assert_layout(result, TCP)


# --- compression_params -------------------------------------------------------------------------------------


def test_compression(tmp_path):
    """Each machine's local sum is compressed (worker momentum and error feedback, codec, then the server's
    error feedback and codec); the small tensors go uncompressed and get their Nesterov momentum after the pull."""
    params, mu = {"compressor": "dithering", "k": 8, "seed": 11, "ef": "vanilla", "momentum": "nesterov"}, 0.5
    result = launch_job(TWO_BY_TWO, script("compression_training.py"),
                        [json.dumps(params), str(tmp_path), str(COMPRESSION_STEPS), str(mu)],
                        env={"BYTEPS_MIN_COMPRESS_BYTES": "64", "MASTER_PORT": str(free_port()), **TCP}, timeout=180)
    assert result.returncode == 0, report(result)
    assert_layout(result, TCP)
    records = [np.load(tmp_path / f"rank{rank}.npz") for rank in range(4)]
    _check_weight(records, ReferenceJob(params, workers=2, momentum=mu, size=4), "2x2 over TCP", per_machine=2)
    for name in ("bias", "gain"):
        expected = uncompressed_rounds([r[f"local_{name}"] for r in records], mu)
        for step in range(COMPRESSION_STEPS):
            for rank, record in enumerate(records):
                np.testing.assert_allclose(record[f"synced_{name}"][step], expected[step], rtol=1e-6, atol=1e-7,
                                           err_msg=f"{name}, step {step}, rank {rank}")


# --- asynchronous training ----------------------------------------------------------------------------------

ASYNC_STEPS, ASYNC_SLEEP_S = 16, 0.5
ASYNC_WIDTH = 2048  # the first weight is 128 KiB: co-located servers get it through shared memory


@pytest.mark.parametrize("layout", LAYOUTS)
def test_async(layout, tmp_path):
    """Rank 3 is slow, so machine 1 is (its local root pushes the machine's sum of deltas); machine 0 does not
    wait for it, and the servers' store ends as rank 0's initial parameters plus every rank's every delta."""
    result = launch_job(TWO_BY_TWO, script("async_training.py"),
                        [str(tmp_path), str(ASYNC_STEPS), "3", str(ASYNC_SLEEP_S), str(ASYNC_WIDTH)],
                        env={"BYTEPS_ENABLE_ASYNC": "1", **LAYOUTS[layout]}, timeout=180)
    output = result.stdout + result.stderr
    assert result.returncode == 0, report(result)
    assert_layout(result, LAYOUTS[layout], large=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(4)]
    slow_s = ASYNC_STEPS * ASYNC_SLEEP_S
    for fast in ranks[:2]:
        assert fast["times"][-1] < 0.5 * slow_s, fast["times"]
    assert ranks[3]["times"][-1] >= slow_s, ranks[3]["times"]
    # One push per machine, key and step (each parameter is one key): the local root pushes the machine's sum.
    applied = int(re.search(r"servers applied (\d+) asynchronous pushes", output).group(1))
    keys = len(ranks[0]["names"])
    assert keys == 4, ranks[0]["names"]
    assert all(rank["pushes"] == (ASYNC_STEPS + 1) * keys for rank in ranks), [rank["pushes"] for rank in ranks]
    assert applied == 2 * (ASYNC_STEPS + 1) * keys, applied
    for name in ranks[0]["names"]:
        expected = ranks[0]["initial"][name] + sum(rank["deltas"][name] for rank in ranks)
        for rank in ranks:
            assert torch.equal(rank["initial"][name], ranks[0]["initial"][name])  # all began from rank 0's values
            torch.testing.assert_close(rank["final"][name], expected, rtol=0, atol=1e-5)


# --- backup workers -----------------------------------------------------------------------------------------


def test_backup_workers(tmp_path):
    """3 machines of one process, b = 1, two servers, every payload over TCP (a 128 KiB weight among them): the
    slow machine skips the rounds that closed without it, and every replica holds each round's average of two
    machines' gradients."""
    result = launch_job(["--workers", "3", "--servers", "2"], script("backup_training.py"),
                        [str(BACKUP_STEPS), str(BACKUP_SLEEP_S), str(tmp_path), "4096"],
                        env={"BYTEPS_BACKUP_WORKERS": "1", **TCP}, timeout=180)
    assert result.returncode == 0, report(result)
    assert_layout(result, TCP)
    found = [json.loads(line) for line in re.findall(r"RESULT (\{.*\})", result.stdout)]
    ranks = {r["rank"]: r for r in found}
    assert len(ranks) == 3
    assert ranks[0]["parameters"] == ranks[1]["parameters"] == ranks[2]["parameters"], ranks
    assert ranks[0]["computed"] == ranks[1]["computed"] == BACKUP_STEPS
    assert 1 <= ranks[2]["computed"] <= BACKUP_STEPS // 2, ranks[2]
    check_rounds(recorded(tmp_path, 3), backup=True)


# --- elastic ------------------------------------------------------------------------------------------------

ELASTIC_EXAMPLE = os.path.join(EXAMPLES, "train_digits_elastic.py")


def test_elastic_refuses_several_processes_per_machine():
    """Elastic workers are machines of one process each (docs/elastic.md): --workers is refused at launch."""
    command = [*LAUNCHER, *TWO_BY_TWO, "--min-np", "2", "--", sys.executable, ELASTIC_EXAMPLE]
    result = subprocess.run(command, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, report(result)
    assert "elastic mode (--min-np/--max-np/--host-discovery-script/--reset-limit) finds its hosts with " \
           "--host-discovery-script (or runs -np workers on this machine); drop --workers" in result.stderr, \
        report(result)
    assert "[worker" not in result.stdout, report(result)  # nothing started


def test_elastic_over_tcp():
    """Three workers, two servers, every payload over TCP: SIGKILL one worker while it trains; the other two
    roll back to their last commit and finish every epoch, never committing a step twice."""
    with WatchedJob(["-np", "3", "--min-np", "2", "--servers", "2"], ELASTIC_EXAMPLE,
                    ["--epochs", "4", "--log-steps", "--min-accuracy", "0.85"], env=TCP) as job:
        job.wait_for(r"^\[worker 1\] step \d+ epoch 2 samples [1-9]", timeout=240)
        os.kill(job.child_pid("BYTEPS_ELASTIC_WORKER", "w1"), signal.SIGKILL)
        job.wait_for(r"^\[worker 0\] joined: rank 0 of 2 at epoch 2", timeout=60)
        result = job.finish(timeout=300)
    output = result.stdout
    assert result.returncode == 0, output[-6000:]
    assert "worker w1 was killed by SIGKILL (signal 9); going on with 2 worker(s)" in output, output[-6000:]
    counted = [int(s) for s in re.findall(r"^\[worker 0\] step (\d+) ", output, re.M)]
    assert counted == sorted(set(counted)), counted
    assert re.search(r"^\[worker 0\] epoch +4: .* with 2 worker\(s\)", output, re.M), output[-6000:]
    accuracy = float(re.search(r"^\[worker \d+\] held-out accuracy (\S+)", output, re.M).group(1))
    assert accuracy >= 0.85, output[-3000:]


# --- SyncBatchNorm ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sync_batch_norm(layout):
    result = launch_job(TWO_BY_TWO, script("sync_batch_norm_checks.py"), env=LAYOUTS[layout], timeout=180)
    assert result.returncode == 0, report(result)
    assert_layout(result, LAYOUTS[layout])
    for rank in range(4):
        assert f"SYNCBN OK rank {rank} of 4 on cpu" in rank_lines(result.stdout, rank), report(result)


# --- gradient wrappers: DistributedOptimizer, DistributedDataParallel and byteps_hook -----------------------

OPTIMIZER_CHECKS = ["average_overlaps_backward", "backward_passes_per_step", "skip_synchronize_with_clipping",
                    "fp16_compression", "requires_grad_changes", "unused_parameters", "predivide_and_sum", "errors",
                    "wrapper_shares_state", "rewrapping_moves_hooks", "fusion_matches_unfused"]
PARALLEL_CHECKS = ["broadcast_at_construction", "average_in_backward", "no_sync", "unused_parameters",
                   "requires_grad_changes", "fp16_compression", "native_ddp_hook", "errors"]


def assert_checks_passed(result: subprocess.CompletedProcess, checks, ranks: int) -> None:
    assert result.returncode == 0, report(result)
    assert_layout(result, TCP)
    for rank in range(ranks):
        printed = rank_lines(result.stdout, rank)
        missing = [name for name in checks if f"OK {name}" not in printed]
        assert not missing, f"rank {rank} did not pass {missing}\n{report(result)}"


def test_optimizer(tmp_path):
    result = launch_job(TWO_BY_TWO, script("optimizer_checks.py"), env={"BYTEPS_TEST_TMP": str(tmp_path), **TCP},
                        timeout=180)
    assert_checks_passed(result, OPTIMIZER_CHECKS, 4)


def test_parallel(tmp_path):
    result = launch_job(TWO_BY_TWO, script("parallel_checks.py"), env={"BYTEPS_TEST_TMP": str(tmp_path), **TCP},
                        timeout=180)
    assert_checks_passed(result, PARALLEL_CHECKS, 4)
