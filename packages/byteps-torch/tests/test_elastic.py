"""Elastic training with byteps.torch (Horovod's hvd.elastic API): the digits example loses a worker to
SIGKILL, finishes with the other two, and takes a new one in later.

Real jobs under bpslaunch --min-np 2 --max-np 3; the kill is ``kill -9``
of one worker process while it trains. The disturbed job must reach the
undisturbed job's held-out accuracy within 2 points, apply no step twice,
and hand the newcomer the weights rank 0 holds.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

from byteps.testkit import LAUNCHER, DiscoveryScript, WatchedJob, clean_env

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "..", "examples", "torch", "train_digits_elastic.py")
# Long enough that a worker started after epoch 3 (discovery's next poll, then starting Python and torch:
# 3-6 s here) joins before the end: at 6 epochs a warm run left it 3 s and failed about 1 time in 3.
EPOCHS = "12"


def accuracy(output):
    return float(re.search(r"^\[worker \d+\] held-out accuracy (\S+)", output, re.M).group(1))


def test_the_digits_example_survives_a_lost_worker_and_takes_in_a_new_one(tmp_path):
    command = [*LAUNCHER, "--grace-period", "2", "-np", "3", "--min-np", "2", "--", sys.executable, EXAMPLE,
               "--epochs", EPOCHS]
    undisturbed = subprocess.run(command, env=clean_env({"OMP_NUM_THREADS": "1"}), capture_output=True, text=True,
                                 timeout=300)
    assert undisturbed.returncode == 0, undisturbed.stdout[-4000:] + undisturbed.stderr[-4000:]

    discovery = DiscoveryScript(tmp_path, "localhost:3")
    flags = ["-np", "3", "--min-np", "2", "--max-np", "3", "--host-discovery-script", discovery.path]
    with WatchedJob(flags, EXAMPLE, ["--epochs", EPOCHS, "--log-steps"]) as job:
        job.wait_for(r"^\[worker 1\] step \d+ epoch 2 samples [1-9]", timeout=240)
        discovery.report("localhost:2")  # the lost host does not come back at once
        os.kill(job.child_pid("BYTEPS_ELASTIC_WORKER", "w1"), signal.SIGKILL)
        job.wait_for(r"^\[worker 0\] joined: rank 0 of 2 at epoch 2", timeout=60)
        mark = len(job.lines)
        job.wait_for(r"^\[worker 0\] epoch  3:", timeout=240, after=mark)
        discovery.report("localhost:3")  # a third worker again: it joins at a commit
        newcomer = job.wait_for(r"^\[worker 3\] joined: rank 2 of 3 at epoch (\d+) batch (\d+), (\d+) steps so far, "
                                r"weights checksum (\S+)", timeout=120)
        result = job.finish(timeout=300)
    output = result.stdout
    assert_survived(result, newcomer, EPOCHS)
    # Reaching it is what counts: the replayed steps after the rollback may well end a little higher.
    assert accuracy(output) >= accuracy(undisturbed.stdout) - 0.02, (accuracy(output), accuracy(undisturbed.stdout))


def assert_survived(result, newcomer, epochs):
    """The job lost w1 and went on, a newcomer took rank 0's exact state, and every epoch ran to its end."""
    output = result.stdout
    assert result.returncode == 0, output[-6000:]
    assert "worker w1 was killed by SIGKILL (signal 9); going on with 2 worker(s)" in output, output[-6000:]
    # The newcomer starts from rank 0's weights and position, exactly.
    epoch, batch, steps, checksum = newcomer.groups()
    assert (f"[worker 0] joined: rank 0 of 3 at epoch {epoch} batch {batch}, {steps} steps so far, "
            f"weights checksum {checksum}") in output, output[-6000:]
    # Rank 0 never commits a step twice: its step counter only goes up.
    counted = [int(s) for s in re.findall(r"^\[worker 0\] step (\d+) ", output, re.M)]
    assert counted == sorted(set(counted)), counted
    # Every epoch ran to its end, the last with 3 workers again.
    assert re.search(rf"^\[worker 0\] epoch +{epochs}: .* with 3 worker\(s\)", output, re.M), output[-6000:]


def test_the_digits_example_trains_asynchronously_through_a_lost_and_an_added_worker(tmp_path):
    # BYTEPS_ENABLE_ASYNC=1 (docs/elastic.md, "Asynchronous training"): every commit takes the servers'
    # parameters; each epoch's fresh servers start from the last commit, broadcast from rank 0.
    discovery = DiscoveryScript(tmp_path, "localhost:3")  # keeps the lost worker's slot: a new worker takes it
    flags = ["-np", "3", "--min-np", "2", "--max-np", "3", "--host-discovery-script", discovery.path]
    # 6 epochs: under load the stale pushes of an asynchronous job slow it, and at 4 one run in a few ended
    # below 0.85 (0.825 with two busy loops beside it; 0.956-0.967 at 6).
    with WatchedJob(flags, EXAMPLE, ["--epochs", "6", "--log-steps", "--min-accuracy", "0.85"],
                    env={"BYTEPS_ENABLE_ASYNC": "1"}) as job:
        job.wait_for(r"^\[worker 1\] step \d+ epoch 2 samples [1-9]", timeout=240)
        os.kill(job.child_pid("BYTEPS_ELASTIC_WORKER", "w1"), signal.SIGKILL)
        job.wait_for(r"^\[worker 0\] joined: rank 0 of 2 at epoch 2", timeout=60)
        newcomer = job.wait_for(r"^\[worker 3\] joined: rank 2 of 3 at epoch (\d+) batch (\d+), (\d+) steps so far, "
                                r"weights checksum (\S+)", timeout=120)
        result = job.finish(timeout=300)
    output = result.stdout
    assert_survived(result, newcomer, 6)
    assert accuracy(output) >= 0.85, output[-3000:]
    assert re.search(r"servers applied asynchronous pushes: \d+ in membership epoch 1, \d+ in membership epoch 2",
                     output), output[-3000:]
