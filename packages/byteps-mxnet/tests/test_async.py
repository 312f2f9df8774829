"""Asynchronous training (BYTEPS_ENABLE_ASYNC=1) in MXNet, through real jobs of 2 workers and 1 server.

scripts/async_training.py trains a small gluon model with rank 1 sleeping
every step, through DistributedTrainer or through a gluon Trainer over
DistributedOptimizer; scripts/async_refusals.py checks what is refused.
"""

from __future__ import annotations

import os
import pickle
import re

import numpy as np
import pytest
from mxnet_jobs import launch_mxnet_job

from byteps.testkit import assert_all_ok, rank_lines

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "scripts")
EXAMPLE = os.path.join(HERE, "..", "..", "..", "examples", "mxnet", "train_digits.py")
LAYOUT = ["--workers", "2", "--servers", "1"]
ASYNC = {"BYTEPS_ENABLE_ASYNC": "1"}
STEPS, SLEEP_S, PARAMETERS = 12, 0.3, 4


def applied_pushes(output: str) -> int:
    """The job's summary line, from the servers' reports: how many deltas they added to their stores."""
    found = re.search(r"servers applied (\d+) asynchronous pushes", output)
    return int(found.group(1)) if found else 0


@pytest.mark.parametrize("mode", ["trainer", "optimizer"])
def test_fast_worker_does_not_wait_and_every_delta_lands_once(tmp_path, mode):
    check_fast_worker_does_not_wait(tmp_path, mode, LAYOUT, workers=2, machines=2, fast_rank=0)


def check_fast_worker_does_not_wait(tmp_path, mode, layout, workers, machines, fast_rank, env=None,
                                    sleep_s=SLEEP_S):
    """The job of async_training.py under ``layout`` (``workers`` ranks on ``machines``, rank 1 slow), checked
    in numpy. ``fast_rank`` is on another machine than rank 1: a machine's ranks sum their deltas locally
    first and its local root pushes the sum (BytePS's async, each GPU machine reduces before it pushes), so
    rank 1's machine-mates go at its pace. A job of more processes on loaded cores takes a longer ``sleep_s``
    (rank 1's pause per step) for the same bound on the fast rank's time relative to it."""
    result = launch_mxnet_job(layout, os.path.join(SCRIPTS, "async_training.py"),
                              [str(tmp_path), str(STEPS), "1", str(sleep_s), mode], env={**ASYNC, **(env or {})})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    ranks = []
    for rank in range(workers):
        with open(tmp_path / f"rank{rank}.pkl", "rb") as saved:
            ranks.append(pickle.load(saved))
    fast, slow = ranks[fast_rank], ranks[1]
    # Synchronous training would hold rank 0 to rank 1's pace, SLEEP_S a step. Its first step waits for
    # rank 1's (the broadcast into the servers' store); the steps after it do not.
    assert fast["times"][-1] - fast["times"][0] < 0.25 * (STEPS - 1) * sleep_s, fast["times"]
    assert slow["times"][-1] >= STEPS * sleep_s
    # Each worker's step is a plain one-process momentum SGD on its own gradient: nothing averaged or
    # divided by the number of workers (a halved step would differ by about 1e-3).
    for rank in ranks:
        assert rank["worst"] < 1e-6, rank["worst"]
    # Exactly once: the servers applied as many deltas as the worker machines pushed (each parameter is one
    # key), every step and the final zero delta on each rank.
    assert all(rank["pushes"] == (STEPS + 1) * PARAMETERS for rank in ranks), [rank["pushes"] for rank in ranks]
    assert applied_pushes(output) == machines * (STEPS + 1) * PARAMETERS
    # The store = rank 0's initial parameters + every delta of every rank.
    for name in fast["names"]:
        expected = ranks[0]["initial"][name] + sum(rank["deltas"][name] for rank in ranks)
        for rank in ranks:
            np.testing.assert_allclose(rank["final"][name], expected, rtol=0, atol=1e-5, err_msg=name)
        if mode == "trainer":  # it broadcast rank 0's weights when built
            for rank in ranks[1:]:
                np.testing.assert_array_equal(rank["initial"][name], ranks[0]["initial"][name])


def test_digits_example_trains_asynchronously():
    result = launch_mxnet_job(LAYOUT, EXAMPLE, env=ASYNC, timeout=180)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]  # the example's own --min-accuracy 0.9 held
    lines = rank_lines(result.stdout, 0)
    text = "\n".join(lines)
    # Measured 0.953 to 0.986 over four seeds (synchronous: 0.978): 2 workers each take full-rate steps
    # of lr 0.05 on their own shard, nearly in step with each other, so the job is close to one SGD run
    # of twice the steps.
    accuracy = float(re.search(r"held-out accuracy (\S+)", text).group(1))
    assert accuracy >= 0.9, text
    steps = int(re.search(r"(\d+) steps per worker per epoch", text).group(1))
    assert applied_pushes(output) == 2 * 10 * steps * 8, output[-2000:]  # 10 epochs, 8 parameters


def test_compression_and_multi_precision_are_refused():
    result = launch_mxnet_job(LAYOUT, os.path.join(SCRIPTS, "async_refusals.py"), env=ASYNC, timeout=90)
    assert_all_ok(result, checks=5)
    refusals = [line for line in rank_lines(result.stdout, 0) if line.startswith("refused: ")]
    assert len(refusals) == 5, refusals
    assert all("drop compression" in line for line in refusals[:4]), refusals
    assert "multi_precision" in refusals[4], refusals
