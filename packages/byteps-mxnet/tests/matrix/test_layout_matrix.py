"""MXNet's cells of the layout matrix (docs/horovod-compatibility.md, "Layouts") that the default run leaves out.

Two layouts, each a real job (bpslaunch, scheduler, servers, workers) running
the default tests' worker scripts, whose every rank checks its numbers
against numpy:

- ``2x2``: 2 machines x 2 processes, two servers (``-np 2 --workers 2
  --servers 2``): 4 ranks, each machine's two summing in shared memory first;
- ``own-hosts``: servers on hosts of their own (``--workers N --servers K``
  with ``BYTEPS_ENABLE_IPC=0``): every payload to and from the servers over
  TCP, none through shared memory, which the job's summary line confirms.
  (These scripts' payloads are all below the 64 KiB that shared memory
  takes, so with ``BYTEPS_ENABLE_IPC=1`` too they would cross TCP: what
  these jobs add is the setting itself, on every process.)

The cells, one test each:

- Min/Max/Product, allgather, alltoall, reducescatter, grouped ops (and
  process sets, join, failed collectives, the timeline): collectives_checks,
  ``test_collectives[2x2]`` and ``test_collectives[own-hosts]`` (the "join"
  row's own-hosts cell too);
- allreduce Adasum (with push_pull, broadcast, the engine order):
  ops_checks, ``test_ops_with_adasum[2x2]``;
- ``compression_params``: compression_checks against
  byteps.testkit.compression_reference, ``test_compression_params[own-hosts]``;
- async: async_training (trainer and optimizer), ``test_async[2x2]`` and
  ``test_async[own-hosts]``;
- backup workers: backup_training (trainer and optimizer, 3 workers),
  ``test_backup_workers[own-hosts]``;
- the gradient wrappers (DistributedTrainer, DistributedOptimizer,
  broadcast_parameters): training_checks, ``test_gradient_wrappers[2x2]``
  and ``test_gradient_wrappers[own-hosts]``.

Run by ``nox -s matrix-mxnet``, not by the default ``nox``.
"""

from __future__ import annotations

import os

import pytest
from mxnet_jobs import launch_mxnet_job
from test_async import check_fast_worker_does_not_wait
from test_backup_workers import check_the_slow_worker_skips_closed_rounds
from test_compression import check_onebit_without_scaling, check_the_reference_algorithm, record
from test_training import check_training

from byteps.testkit import assert_all_ok, rank_lines, report

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")
TWO_BY_TWO = ["-np", "2", "--workers", "2", "--servers", "2"]
TCP_ONLY = {"BYTEPS_ENABLE_IPC": "0"}
#: layout name -> (bpslaunch arguments for 2 worker machines, environment, worker ranks)
LAYOUTS = {
    "2x2": (TWO_BY_TWO, {}, 4),
    "own-hosts": (["--workers", "2", "--servers", "2"], TCP_ONLY, 2),
}


def assert_no_shared_memory(result) -> None:
    """The job's summary: it finished, and no payload moved through shared memory to or from a server."""
    summary = [line for line in result.stderr.splitlines() if line.startswith("bpslaunch: job done in ")]
    assert len(summary) == 1 and "shared memory" not in summary[0], report(result)


@pytest.mark.parametrize("layout", ["2x2", "own-hosts"])
def test_collectives(layout, tmp_path):
    arguments, env, ranks = LAYOUTS[layout]
    result = launch_mxnet_job(arguments, os.path.join(SCRIPTS, "collectives_checks.py"),
                              env={"BYTEPS_TEST_TMP": str(tmp_path), **env})
    assert_all_ok(result, checks=8, ranks=ranks)
    if env:
        assert_no_shared_memory(result)


@pytest.mark.parametrize("layout", ["2x2"])
def test_ops_with_adasum(layout):
    arguments, env, ranks = LAYOUTS[layout]
    result = launch_mxnet_job(arguments, os.path.join(SCRIPTS, "ops_checks.py"), env=env)
    assert_all_ok(result, checks=9, ranks=ranks)
    for rank in range(ranks):
        info = [line for line in rank_lines(result.stdout, rank) if line.startswith("INFO")]
        assert info == [f"INFO rank={rank} size=4 local_rank={rank % 2} local_size=2"], info


@pytest.mark.parametrize("layout", ["own-hosts"])
def test_compression_params(layout, tmp_path):
    arguments, env, _ = LAYOUTS[layout]
    recorded = record(tmp_path, arguments, env)
    for case, records in recorded.items():
        check_the_reference_algorithm(records, case)
    check_onebit_without_scaling(recorded["onebit-plain"])


@pytest.mark.parametrize("layout", ["2x2", "own-hosts"])
def test_async(layout, tmp_path):
    arguments, env, ranks = LAYOUTS[layout]
    fast_rank = 2 if ranks == 4 else 0  # with 2 x 2 rank 0 shares rank 1's machine and goes at its pace
    for mode in ("trainer", "optimizer"):
        (tmp_path / mode).mkdir()
        check_fast_worker_does_not_wait(tmp_path / mode, mode, arguments, ranks, 2, fast_rank, env, sleep_s=0.6)


@pytest.mark.parametrize("layout", ["own-hosts"])
def test_backup_workers(layout, tmp_path):
    _, env, _ = LAYOUTS[layout]
    for mode in ("trainer", "optimizer"):
        (tmp_path / mode).mkdir()
        check_the_slow_worker_skips_closed_rounds(
            tmp_path / mode, mode, ["--workers", "3", "--servers", "2"], env)


@pytest.mark.parametrize("layout", ["2x2", "own-hosts"])
def test_gradient_wrappers(layout):
    arguments, env, ranks = LAYOUTS[layout]
    result = check_training(arguments, env, ranks)
    if env:
        assert_no_shared_memory(result)
