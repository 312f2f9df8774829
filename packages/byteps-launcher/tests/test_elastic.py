"""Elastic jobs (bpslaunch --min-np/--max-np): real processes killed with SIGKILL, and the job goes on.

The workers (elastic_worker.py) run byteps.common's push_pull and commit
every step, printing what they hold; the tests replay the same steps in
numpy for the job sizes the workers report and compare exactly, so a
step lost or summed twice shows. Every process a job started is checked
dead at the end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from byteps.testkit import LAUNCHER, DiscoveryScript, WatchedJob, children_with_variable, clean_env, wait_until_dead

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "elastic_worker.py")
HELD_WORKER = os.path.join(HERE, "elastic_held_worker.py")
STEPS = 12


def replay(sizes):
    """x after steps 1, 2, ... with these job sizes: each step adds the average of (rank + 1) * step."""
    x = 0.0
    for step, size in enumerate(sizes, start=1):
        x += sum((rank + 1) * step for rank in range(size)) / size
    return x


def steps_of(output, worker):
    """(step, size, x) from ``[worker N] step S size N x X`` lines, in order."""
    pattern = re.compile(rf"^\[worker {worker}\] step (\d+) size (\d+) x (\S+)$", re.M)
    return [(int(s), int(n), float(x)) for s, n, x in pattern.findall(output)]


def final_x(output, worker):
    return float(re.search(rf"^\[worker {worker}\] final step {STEPS} x (\S+)$", output, re.M).group(1))


def job_pids(job):
    """Every scheduler, server and worker bpslaunch has running now."""
    return [pid for role in ("scheduler", "server", "worker")
            for pid in children_with_variable(job.process.pid, "DMLC_ROLE", role)]


def assert_each_step_once(records, resumed_at=None):
    steps = [s for s, _, _ in records]
    assert steps == sorted(set(steps)), f"a step applied twice or out of order: {steps}"
    missing = set(range(1, STEPS + 1)) - set(steps) - {resumed_at}
    assert not missing, f"steps never committed: {sorted(missing)} ({steps})"


def sizes_by_step(records, default):
    seen = {s: n for s, n, _ in records}
    return [seen.get(step, default) for step in range(1, STEPS + 1)]


def epoch_file(job):
    """The membership epoch bpslaunch publishes now (read from where its workers read it)."""
    with open(f"/proc/{job.child_pid('BYTEPS_ELASTIC_WORKER', 'w0')}/environ", "rb") as f:
        variables = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    with open(os.path.join(variables[b"BYTEPS_ELASTIC_DIR"].decode(), "epoch.json")) as f:
        return json.load(f)


def stale_worker(old, new):
    """A worker holding epoch ``old``'s job id and secret that reaches epoch ``new``'s scheduler."""
    env = clean_env({"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(new["root_port"]),
                     "DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "1", "DMLC_WORKER_ID": "1",
                     "BYTEPS_JOB_ID": old["job_id"], "BYTEPS_JOB_SECRET": old["secret"],
                     "BYTEPS_RENDEZVOUS_TIMEOUT": "10"})
    return subprocess.run([sys.executable, "-c", "import byteps.common as bps; bps.init()"], env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_killed_worker_leaves_the_others_going_from_their_last_commit():
    with WatchedJob(["-np", "3", "--min-np", "2"], WORKER, [str(STEPS), "0.3"]) as job:
        job.wait_for(r"^\[worker 2\] step 4 ")
        pids = job_pids(job)
        first = epoch_file(job)
        os.kill(job.child_pid("BYTEPS_ELASTIC_WORKER", "w2"), signal.SIGKILL)
        killed = time.monotonic()
        resumed_at = int(job.wait_for(r"^\[worker 0\] joined 1 rank 0 of 2 at step (\d+)").group(1))
        recovery_s = time.monotonic() - killed
        # A process of the old epoch cannot take part in the new one: it fails authentication.
        stale = stale_worker(first, epoch_file(job))
        result = job.finish(timeout=120)
    assert stale.returncode != 0 and "does not know this job's secret" in stale.stderr, stale.stderr[-3000:]
    output = result.stdout
    assert result.returncode == 0, output[-6000:]
    assert "worker w2 was killed by SIGKILL (signal 9); going on with 2 worker(s)" in output, output[-6000:]
    assert "membership epoch 1 (a process was lost): 2 worker(s) w0, w1" in output
    assert 4 <= resumed_at <= 6, output[-6000:]
    assert f"[worker 1] joined 1 rank 1 of 2 at step {resumed_at}" in output
    records = steps_of(output, 0)
    assert_each_step_once(records, resumed_at)
    sizes = [3] * resumed_at + [2] * (STEPS - resumed_at)
    assert sizes_by_step(records, 3) == sizes
    assert final_x(output, 0) == final_x(output, 1) == replay(sizes)
    assert recovery_s < 15, f"{recovery_s:.1f} s from the kill to the survivors' new epoch"
    assert wait_until_dead(pids, timeout=10) == []


def test_a_hung_worker_is_stopped_and_the_others_go_on_without_it():
    # SIGSTOP: the process lives on but says nothing, as a hung worker or a host cut off from the network.
    # Only the scheduler can tell (no heartbeat); it names the worker to bpslaunch, which stops it.
    with WatchedJob(["-np", "3", "--min-np", "2"], WORKER, [str(STEPS), "0.3"],
                    env={"PS_HEARTBEAT_TIMEOUT": "3"}) as job:
        job.wait_for(r"^\[worker 2\] step 4 ")
        pids = job_pids(job)
        hung = job.child_pid("BYTEPS_ELASTIC_WORKER", "w2")
        os.kill(hung, signal.SIGSTOP)
        resumed_at = int(job.wait_for(r"^\[worker 0\] joined 1 rank 0 of 2 at step (\d+)", timeout=60).group(1))
        result = job.finish(timeout=120)
    output = result.stdout
    assert result.returncode == 0, output[-6000:]
    assert re.search(r"worker w2: worker 2 local rank 0 .* sent no heartbeat for [\d.]+ s \(PS_HEARTBEAT_TIMEOUT=3\): "
                     r"presumed dead; stopping it \(SIGKILL\) and going on without it", output), output[-6000:]
    assert "membership epoch 1 (a process was lost): 2 worker(s) w0, w1" in output, output[-6000:]
    records = steps_of(output, 0)
    assert_each_step_once(records, resumed_at)
    sizes = [3] * resumed_at + [2] * (STEPS - resumed_at)
    assert sizes_by_step(records, 3) == sizes
    assert final_x(output, 0) == final_x(output, 1) == replay(sizes)
    assert wait_until_dead(pids + [hung], timeout=10) == []


@pytest.mark.parametrize("role", ["server", "scheduler"])
def test_a_killed_server_or_scheduler_is_replaced_and_nothing_is_lost_or_counted_twice(role):
    # A dead scheduler tells no one: the workers see bpslaunch publish the next epoch, well before
    # PS_HEARTBEAT_TIMEOUT (10 s) would have them notice its silence.
    with WatchedJob(["-np", "2", "--min-np", "2", "--servers", "2"], WORKER, [str(STEPS), "0.2"]) as job:
        job.wait_for(r"^\[worker 1\] step 4 ")
        pids = job_pids(job)
        victim = children_with_variable(job.process.pid, "DMLC_ROLE", role)[0]
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        resumed_at = int(job.wait_for(r"^\[worker 0\] joined 1 rank 0 of 2 at step (\d+)", timeout=60).group(1))
        recovery_s = time.monotonic() - killed
        result = job.finish(timeout=120)
    assert recovery_s < 8, f"{recovery_s:.1f} s from the kill to the new epoch"
    output = result.stdout
    assert result.returncode == 0, output[-6000:]
    assert re.search(rf"{role}( \d)? of epoch 0 was killed by SIGKILL", output), output[-6000:]
    records = steps_of(output, 0)
    assert_each_step_once(records, resumed_at)
    # The same two workers throughout: exactly the undisturbed job's numbers.
    assert final_x(output, 0) == final_x(output, 1) == replay([2] * STEPS)
    assert wait_until_dead(pids, timeout=10) == []


@pytest.mark.parametrize("role", ["server", "worker"])
def test_a_held_table_comes_back_from_the_last_commit_after_a_loss(role):
    """A table held by the servers (docs/sparse.md) is saved at every commit. A server killed mid-training takes
    its rows with it, a worker killed mid-step leaves its round half pushed; either way the next epoch's fresh
    servers load the last commit's save, and the job ends with exactly the rows of a numpy replay of the steps it
    committed (with each step's job size), where fresh servers alone would have started the table over."""
    sys.path.insert(0, HERE)
    from elastic_held_worker import HELD, step_rows

    from byteps.common.held_table import initial_rows

    workers = 2 if role == "server" else 3
    with WatchedJob(["-np", str(workers), "--min-np", "2", "--servers", "2"], HELD_WORKER, [str(STEPS), "0.2"]) as job:
        job.wait_for(r"^\[worker 1\] step 4 ")
        pids = job_pids(job)
        victim = children_with_variable(job.process.pid, "DMLC_ROLE", "server")[1] if role == "server" else \
            job.child_pid("BYTEPS_ELASTIC_WORKER", f"w{workers - 1}")
        os.kill(victim, signal.SIGKILL)
        resumed_at = int(job.wait_for(r"^\[worker 0\] joined 1 rank 0 of 2 at step (\d+)", timeout=60).group(1))
        result = job.finish(timeout=120)
    output = result.stdout
    assert result.returncode == 0, output[-6000:]
    assert resumed_at >= 4, output[-6000:]  # the table had been trained and committed before the loss
    sizes = {int(s): int(n) for s, n in re.findall(r"^\[worker 0\] step (\d+) size (\d+)$", output, re.M)}
    assert sorted(sizes) == list(range(1, STEPS + 1)), output[-6000:]
    rows = initial_rows(HELD, np.arange(50), 4).astype(np.float64)
    for step in range(1, STEPS + 1):
        for rank in range(sizes[step]):
            ids, grads = step_rows(step, rank)
            rows[ids] -= HELD.lr * grads / sizes[step]
    final = re.search(r"^\[worker 0\] final (.*)$", output, re.M)
    assert final, output[-6000:]
    np.testing.assert_allclose(np.array(json.loads(final.group(1))).reshape(50, 4), rows, rtol=1e-5, atol=1e-6)
    assert wait_until_dead(pids, timeout=10) == []


def test_a_worker_reported_by_discovery_joins_at_a_commit_with_the_current_state(tmp_path):
    discovery = DiscoveryScript(tmp_path, "localhost:2")
    flags = ["-np", "2", "--min-np", "2", "--max-np", "3", "--host-discovery-script", discovery.path]
    with WatchedJob(flags, WORKER, [str(STEPS), "0.3"]) as job:
        job.wait_for(r"^\[worker 0\] step 3 ")
        discovery.report("localhost:3")
        joined = job.wait_for(r"^\[worker 2\] joined 1 rank 2 of 3 at step (\d+) x (\S+)", timeout=60)
        result = job.finish(timeout=120)
    output = result.stdout
    assert result.returncode == 0, output[-6000:]
    assert "discovery reports 3 slot(s): started worker(s) w2" in output
    step, x = joined.group(1), joined.group(2)
    assert f"[worker 0] joined 1 rank 0 of 3 at step {step} x {x}" in output, output[-6000:]
    records = steps_of(output, 0)
    assert_each_step_once(records, int(step))  # that step's commit raised HostsUpdatedInterrupt, after saving
    sizes = sizes_by_step(records, 2)
    assert sizes == [2] * int(step) + [3] * (STEPS - int(step))
    assert final_x(output, 0) == final_x(output, 2) == replay(sizes)


def test_a_worker_discovery_no_longer_reports_leaves_at_a_commit(tmp_path):
    discovery = DiscoveryScript(tmp_path, "localhost:3")
    flags = ["-np", "3", "--min-np", "2", "--max-np", "3", "--host-discovery-script", discovery.path]
    with WatchedJob(flags, WORKER, [str(STEPS), "0.3"]) as job:
        job.wait_for(r"^\[worker 0\] step 3 ")
        pids = job_pids(job)
        discovery.report("localhost:2")
        joined = job.wait_for(r"^\[worker 0\] joined 1 rank 0 of 2 at step (\d+)", timeout=60)
        result = job.finish(timeout=120)
    output = result.stdout
    assert result.returncode == 0, output[-6000:]
    assert "discovery reports 2 slot(s): worker(s) w2 leave at the members' next commit" in output
    assert "membership epoch 1 (workers removed): 2 worker(s) w0, w1" in output
    step = int(joined.group(1))
    records = steps_of(output, 0)
    assert_each_step_once(records, step)  # the commit that saw the change saved its step and raised
    sizes = sizes_by_step(records, 3)
    assert sizes == [3] * step + [2] * (STEPS - step)
    assert final_x(output, 0) == final_x(output, 1) == replay(sizes)
    assert wait_until_dead(pids, timeout=10) == []


def test_fewer_workers_than_min_np_end_the_job_with_the_dead_workers_status():
    with WatchedJob(["-np", "2", "--min-np", "2"], WORKER, [str(STEPS), "0.2"]) as job:
        job.wait_for(r"^\[worker 1\] step 2 ")
        pids = job_pids(job)
        os.kill(job.child_pid("BYTEPS_ELASTIC_WORKER", "w1"), signal.SIGKILL)
        result = job.finish(timeout=60)
    assert result.returncode == 128 + signal.SIGKILL, result.stdout[-4000:]
    assert "worker w1 was killed by SIGKILL (signal 9); 1 worker(s) left, fewer than --min-np 2" in result.stdout
    assert wait_until_dead(pids, timeout=10) == []


def test_the_reset_limit_ends_the_job():
    with WatchedJob(["-np", "3", "--min-np", "1", "--reset-limit", "0"], WORKER, [str(STEPS), "0.2"]) as job:
        job.wait_for(r"^\[worker 2\] step 2 ")
        os.kill(job.child_pid("BYTEPS_ELASTIC_WORKER", "w2"), signal.SIGKILL)
        result = job.finish(timeout=60)
    assert result.returncode == 128 + signal.SIGKILL, result.stdout[-4000:]
    assert "the job already changed membership 0 time(s) (--reset-limit 0)" in result.stdout


def _script(tmp_path, body):
    path = tmp_path / "discover.sh"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("flags, message", [
    (["-np", "2", "--min-np", "3", "--max-np", "2"], "--min-np 3 is larger than --max-np 2"),
    (["-np", "4", "--min-np", "1", "--max-np", "3"], "-np 4 must lie between --min-np 1 and --max-np 3"),
    (["--max-np", "3"], "elastic mode needs -np"),
    (["-np", "2", "--min-np", "0"], "--min-np must be >= 1"),
    (["-np", "2", "--min-np", "1", "-H", "localhost:2"], "drop -H/--hostfile"),
    (["-np", "2", "--min-np", "1", "--max-restarts", "1"], "drop --max-restarts"),
    (["-np", "2", "--min-np", "1", "--host-discovery-script", "/nonexistent/discover.sh"], "cannot be run"),
    (["-np", "2", "--min-np", "1", "--host-discovery-script", "{fails}"], "exited with code 3: no inventory"),
    (["-np", "2", "--min-np", "1", "--host-discovery-script", "{garbage}"], "is not a host"),
    (["-np", "2", "--min-np", "2", "--host-discovery-script", "{remote}"],
     "reports 1 usable slot(s), fewer than --min-np 2 (node7.invalid: cannot run"),
    (["-np", "2", "--min-np", "2", "--host-discovery-script", "{one}"],
     "reports 1 usable slot(s), fewer than --min-np 2"),
])
def test_bad_elastic_command_lines_are_refused_naming_the_fix(tmp_path, flags, message):
    scripts = {"{fails}": "echo no inventory >&2; exit 3", "{garbage}": "echo 'not a host!'",
               "{remote}": "echo localhost:1; echo node7.invalid:2", "{one}": "echo localhost:1"}
    flags = [_script(tmp_path, scripts[f]) if f in scripts else f for f in flags]
    started = time.monotonic()
    result = subprocess.run([*LAUNCHER, *flags, "--", "python", "-c", "pass"], env=clean_env({}),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr, result.stderr
    assert time.monotonic() - started < 30
