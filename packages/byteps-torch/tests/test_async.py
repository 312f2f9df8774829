"""Asynchronous training in real jobs (docs/async.md): no worker waits for another, every delta counts once."""

import os
import re

import pytest
import torch

from byteps.testkit import launch_job, rank_lines

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "scripts", "async_training.py")
EXAMPLES = os.path.join(HERE, "..", "..", "..", "examples", "torch")
STEPS = 20


def run(tmp_path, env, steps=STEPS, slow_rank=1, sleep_s=0.5, timeout=120):
    result = launch_job(["--workers", "2", "--servers", "1"], SCRIPT,
                        [str(tmp_path), str(steps), str(slow_rank), str(sleep_s)], env=env, timeout=timeout)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    # The job's summary line, from the servers' reports: how many deltas they added to their stores.
    applied = re.search(r"servers applied (\d+) asynchronous pushes", output)
    return result, ranks, int(applied.group(1)) if applied else 0


def test_async_fast_worker_does_not_wait_and_every_delta_lands_once(tmp_path):
    _, ranks, applied = run(tmp_path, {"BYTEPS_ENABLE_ASYNC": "1"})
    fast, slow = ranks
    # Synchronous training would hold rank 0 to rank 1's pace: 20 x 0.5 s.
    assert fast["times"][-1] < 5.0, fast["times"]
    assert slow["times"][-1] >= STEPS * 0.5
    # Exactly once: the servers applied as many deltas as the workers pushed (each parameter is one key here).
    assert applied == fast["pushes"] + slow["pushes"] == 2 * (STEPS + 1) * 4
    # The store = rank 0's initial parameters + every delta of every rank.
    for name in fast["names"]:
        expected = fast["initial"][name] + fast["deltas"][name] + slow["deltas"][name]
        for rank in ranks:
            torch.testing.assert_close(rank["final"][name], expected, rtol=0, atol=1e-5)
        assert torch.equal(slow["initial"][name], fast["initial"][name])  # both began from rank 0's values


def test_synchronous_training_waits_for_the_slow_worker(tmp_path):
    _, (fast, slow), applied = run(tmp_path, {}, steps=8)
    # Each step of the fast rank waits for the slow rank's push of that step, which the slow rank makes
    # only after finishing its previous step (0.5 s of sleep each; stamps: one monotonic clock for both
    # processes). Checked step by step, not against a total: the ranks' start-up skew must not decide it.
    for step in range(1, 8):
        assert fast["stamps"][step] >= slow["stamps"][step - 1], (step, fast["stamps"], slow["stamps"])
    assert fast["stamps"][-1] - slow["stamps"][0] >= 6 * 0.5  # so the fast rank kept the slow one's pace
    assert applied == 0


def test_staleness_bound_keeps_the_fast_worker_within_two_steps(tmp_path):
    result, ranks, _ = run(tmp_path, {"BYTEPS_ENABLE_ASYNC": "1", "BYTEPS_ASYNC_MAX_STALENESS": "2"}, steps=12,
                           sleep_s=0.3)
    fast, slow = ranks[0]["stamps"], ranks[1]["stamps"]
    # When rank 0 finished step k, rank 1 had finished step k - 2 at least (it pushed it before).
    for k, done in enumerate(fast, start=1):
        slow_done = sum(t <= done for t in slow)
        assert k - slow_done <= 2 + 1, (k, slow_done, fast, slow)  # +1: rank 1's pull may trail its push
    assert ranks[0]["times"][-1] >= (12 - 2 - 1) * 0.3


def test_digits_example_trains_asynchronously():
    result = launch_job(["--workers", "2", "--servers", "1"], os.path.join(EXAMPLES, "train_digits.py"),
                        env={"BYTEPS_ENABLE_ASYNC": "1"}, timeout=120)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    text = "\n".join(rank_lines(result.stdout, 0))
    accuracy = float(re.search(r"held-out accuracy (\S+)", text).group(1))
    assert accuracy >= 0.85, text


@pytest.mark.parametrize("env,fragment", [
    ({"BYTEPS_ENABLE_ASYNC": "1", "BYTEPS_BACKUP_WORKERS": "1"}, "BYTEPS_BACKUP_WORKERS: applies to synchronous"),
    ({"BYTEPS_ASYNC_MAX_STALENESS": "2"}, "BYTEPS_ASYNC_MAX_STALENESS: bounds asynchronous training"),
    ({"BYTEPS_BACKUP_WORKERS": "2"}, "BYTEPS_BACKUP_WORKERS: must be less than DMLC_NUM_WORKER=2"),
])
def test_bad_training_mode_settings_are_refused_before_anything_starts(tmp_path, env, fragment):
    result = launch_job(["--workers", "2", "--servers", "1"], SCRIPT, [str(tmp_path), "1", "1", "0"], env=env,
                        timeout=60)
    assert result.returncode != 0
    assert fragment in result.stderr, result.stderr[-3000:]
