"""Asynchronous training in an elastic job: a worker killed with SIGKILL, a new one let in, every delta once.

The workers (elastic_async_worker.py) exchange deltas that depend on
their lasting name and the step only, and commit every step. The test
replays, in numpy, the steps of the job's final lineage with the members
that took them: every committed value must be the initial one plus each
delta of that lineage exactly once (a delta applied to the lost epoch's
servers after the last commit is dropped with them and applied again
when the step is replayed), and the servers of each epoch that ended
cleanly must have applied exactly the pushes its steps and commits made.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess

from byteps.testkit import LAUNCHER, DiscoveryScript, WatchedJob, children_with_variable, clean_env, wait_until_dead

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "elastic_async_worker.py")
STEPS = 14
PARAMETERS = 2  # a and b: one key each (one partition)


def deltas(worker, step):
    """What the worker named ``worker`` adds at ``step``: to every element of a, and to b."""
    number = int(worker[1:])
    return (number + 1) * 100 + step, (1, number + 1)


def replay(lineage, upto):
    """a, b0, b1 after steps 1..upto of ``lineage`` (step -> its members), from w0's initial values."""
    a, b0, b1 = 7.0, 0.0, 0.0
    for step in range(1, upto + 1):
        for worker in lineage[step]:
            da, (db0, db1) = deltas(worker, step)
            a, b0, b1 = a + da, b0 + db0, b1 + db1
    return a, b0, b1


def lineage_of(output):
    """w0's view of the job: its epochs (number, members, step it resumed at) and each committed step's
    values. w0 is rank 0 in every epoch, so the job's state is always its own."""
    joined = re.compile(r"^\[worker 0\] joined (\d+) rank 0 of \d+ members (\S+) at step (\d+) a (\S+)$")
    stepped = re.compile(r"^\[worker 0\] step (\d+) size \d+ a (\S+) b (\S+) (\S+)$")
    epochs, records = [], []
    for line in output.splitlines():
        if joined.match(line):
            number, members, at, a = joined.match(line).groups()
            epochs.append((int(number), members.split(","), int(at), float(a)))
        elif stepped.match(line):
            step, a, b0, b1 = stepped.match(line).groups()
            records.append((len(epochs) - 1, int(step), (float(a), float(b0), float(b1))))
    return epochs, records


def test_async_training_keeps_every_delta_once_through_a_lost_and_an_added_worker(tmp_path):
    # Discovery keeps reporting 3 slots: the killed worker's slot gets a new worker, who joins at a commit.
    discovery = DiscoveryScript(tmp_path, "localhost:3")
    flags = ["-np", "3", "--min-np", "2", "--max-np", "3", "--host-discovery-script", discovery.path]
    with WatchedJob(flags, WORKER, [str(STEPS), "0.25"], env={"BYTEPS_ENABLE_ASYNC": "1"}) as job:
        job.wait_for(r"^\[worker 2\] step 4 ")
        pids = [pid for role in ("scheduler", "server", "worker")
                for pid in children_with_variable(job.process.pid, "DMLC_ROLE", role)]
        os.kill(job.child_pid("BYTEPS_ELASTIC_WORKER", "w2"), signal.SIGKILL)
        job.wait_for(r"^\[worker 3\] joined 2 rank 2 of 3 members w0,w1,w3 ", timeout=90)
        result = job.finish(timeout=120)
    output = result.stdout
    assert result.returncode == 0, output[-6000:]
    assert "worker w2 was killed by SIGKILL (signal 9); going on with 2 worker(s)" in output, output[-6000:]

    epochs, records = lineage_of(output)
    assert [(number, members) for number, members, _, _ in epochs] == [
        (0, ["w0", "w1", "w2"]), (1, ["w0", "w1"]), (2, ["w0", "w1", "w3"])], output[-6000:]
    starts = [at for _, _, at, _ in epochs] + [STEPS]
    assert starts[0] == 0 and 3 <= starts[1] <= 5 and starts[1] < starts[2] < STEPS, starts
    # The final lineage: each step taken by the members of the epoch that committed it last.
    lineage = {step: epochs[e][1] for e in range(len(epochs)) for step in range(starts[e] + 1, starts[e + 1] + 1)}

    # Every commit w0 made holds the lineage's deltas up to it, each once (those of its epoch's own steps).
    steps = [step for _, step, _ in records]
    assert steps == sorted(set(steps)), f"a step committed twice by w0: {steps}"
    for epoch, step, values in records:
        history = {s: lineage[s] if s <= starts[epoch] else epochs[epoch][1] for s in range(1, step + 1)}
        assert values == replay(history, step), (epoch, step, values, output[-6000:])
    # An epoch starts from the last commit: what w0 and the newcomer hold when they (re)enter the loop.
    for number, _, at, a in epochs:
        assert a == replay(lineage, at)[0], (number, at, a)
    newcomer = re.search(r"^\[worker 3\] joined 2 rank 2 of 3 members \S+ at step (\d+) a (\S+)$", output, re.M)
    assert (int(newcomer.group(1)), float(newcomer.group(2))) == (starts[2], replay(lineage, starts[2])[0])

    # The end: on every worker that finished, exactly the initial values plus every delta of the lineage.
    expected = "a {:.17g} b {:.17g} {:.17g}".format(*replay(lineage, STEPS))
    for worker in (0, 1, 3):
        assert f"[worker {worker}] final step {STEPS} {expected}" in output, output[-6000:]

    # Each epoch that ended cleanly: its servers applied one push per parameter for each member's step and
    # each member's commit (a zero change that takes the store). The lost epoch's servers die with it.
    applied = re.search(r"servers applied asynchronous pushes: (.*)$", output, re.M)
    assert applied, output[-3000:]
    counts = {int(e): int(n) for n, e in re.findall(r"(\d+) in membership epoch (\d+)", applied.group(1))}
    assert counts == {e: len(epochs[e][1]) * (starts[e + 1] - starts[e]) * 2 * PARAMETERS for e in (1, 2)}, \
        (counts, starts)
    assert wait_until_dead(pids, timeout=10) == []


def test_async_training_with_epochs_of_one_worker_is_refused_naming_min_np():
    # -np 3 passes for itself (each epoch has servers of its own); --min-np 1 would let an epoch have one worker.
    result = subprocess.run([*LAUNCHER, "-np", "3", "--min-np", "1", "--max-np", "3", "--", "python", "-c", "pass"],
                            env=clean_env({"BYTEPS_ENABLE_ASYNC": "1"}), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "BYTEPS_ENABLE_ASYNC: asynchronous training needs more than one worker process" in result.stderr
    assert "as few as --min-np 1 worker(s): give a larger --min-np" in result.stderr, result.stderr
