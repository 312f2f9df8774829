"""Elastic training with byteps.tensorflow and byteps.keras (Horovod's hvd.elastic): a worker killed with
SIGKILL mid-training, the others roll back to their last commit and finish.

``tape``: the gradients come out of a tf.function, so the lost job reaches
the training loop as TensorFlow's AbortedError from inside a graph; the
final variable is replayed exactly for the job sizes the workers report.
``fit``: Keras model.fit with Horovod's elastic callbacks (KerasState,
CommitStateCallback, UpdateBatchStateCallback, UpdateEpochStateCallback),
synchronous (both asynchronously: matrix/test_elastic_matrix.py).
"""

from __future__ import annotations

import os
import re
import signal

from tf_jobs import SCRIPTS, TF_SETTINGS

from byteps.testkit import WatchedJob

SCRIPT = os.path.join(SCRIPTS, "elastic_training.py")


def test_a_custom_loop_survives_a_lost_worker_with_exact_numbers():
    # Asynchronously: matrix/test_elastic_matrix.py (torch's and the launcher's default runs have async elastic)
    custom_loop_survives_a_lost_worker("tape")


def custom_loop_survives_a_lost_worker(mode, asynchronous=False, extra_env=None, extra_launch=()):
    """The custom loop (``tape``, or ``tape-eager``) of 3 workers loses one at step 3; returns the job's output.
    ``extra_launch``: more bpslaunch options (e.g. servers of their own)."""
    steps = 10
    env = {**TF_SETTINGS, **({"BYTEPS_ENABLE_ASYNC": "1"} if asynchronous else {}), **(extra_env or {})}
    with WatchedJob(["-np", "3", "--min-np", "2", *extra_launch], SCRIPT, [mode, str(steps), "0.3"], env=env) as job:
        job.wait_for(r"^\[worker 2\] step 3 ", timeout=240)
        os.kill(job.child_pid("BYTEPS_ELASTIC_WORKER", "w2"), signal.SIGKILL)
        resumed_at = int(job.wait_for(r"^\[worker 0\] joined 1 rank 0 of 2 at step (\d+)", timeout=60).group(1))
        result = job.finish(timeout=180)
    output = result.stdout
    assert result.returncode == 0, output[-6000:]
    records = [(int(s), int(n)) for s, n in re.findall(r"^\[worker 0\] step (\d+) size (\d+) ", output, re.M)]
    counted = [s for s, _ in records]
    assert counted == sorted(set(counted)), counted
    sizes = [3] * resumed_at + [2] * (steps - resumed_at)
    assert [n for s, n in records if s != resumed_at] == [n for s, n in enumerate(sizes, 1) if s in counted
                                                          and s != resumed_at]
    expected = -sum(sum((rank + 1) * step for rank in range(size)) / (1 if asynchronous else size)
                    for step, size in enumerate(sizes, 1))
    finals = re.findall(rf"^\[worker [01]\] final step {steps} w (\S+)$", output, re.M)
    assert [float(f) for f in finals] == [expected, expected], (finals, expected)
    return output


def test_keras_fit_with_the_elastic_callbacks_survives_a_lost_worker():
    keras_fit_survives_a_lost_worker()


def keras_fit_survives_a_lost_worker(asynchronous=False, extra_env=None):
    """Keras fit with the elastic callbacks loses a worker in its second epoch and finishes."""
    epochs, workers = 4, 3 if asynchronous else 2
    env = {**TF_SETTINGS, **({"BYTEPS_ENABLE_ASYNC": "1"} if asynchronous else {}), **(extra_env or {})}
    flags = ["-np", str(workers), "--min-np", str(workers - 1)]
    with WatchedJob(flags, SCRIPT, ["fit", str(epochs), "0.05"], env=env) as job:
        job.wait_for(r"^\[worker 1\] batch 1 3$", timeout=240)  # mid-fit, in its second epoch
        os.kill(job.child_pid("BYTEPS_ELASTIC_WORKER", "w1"), signal.SIGKILL)
        rejoined = job.wait_for(rf"^\[worker 0\] joined 1 rank 0 of {workers - 1} at epoch (\d+) batch (\d+)",
                                timeout=60)
        result = job.finish(timeout=180)
    output = result.stdout
    assert result.returncode == 0, output[-6000:]
    assert f"worker w1 was killed by SIGKILL (signal 9); going on with {workers - 1} worker(s)" in output
    if asynchronous:  # every rank ends with the servers' weights, taken at the last commit
        checksums = re.findall(rf"^\[worker [02]\] final epoch {epochs} checksum (\S+)$", output, re.M)
        assert len(checksums) == 2 and checksums[0] == checksums[1], output[-6000:]
    assert re.search(rf"^\[worker 0\] final epoch {epochs} checksum ", output, re.M), output[-6000:]
    assert int(rejoined.group(1)) < epochs
    return output
