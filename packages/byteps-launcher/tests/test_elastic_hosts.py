"""Elastic jobs over several hosts: workers started over ssh on the hosts a discovery script names.

The "hosts" are 127.0.0.2 and 127.0.0.3, each with an OpenSSH server of
its own (byteps.testkit.SshHosts); bpslaunch reaches them over ssh as on a
real cluster, and its workers there read the membership from its
rendezvous service, not from its epoch folder. The workers are
elastic_worker.py (byteps.common only); the job's numbers are replayed in
numpy exactly, as in test_elastic.py. The session that runs these
(`nox -s tests-engines`) installs openssh-server.
"""

from __future__ import annotations

import os
import re
import signal

from conftest import SSH_HOSTS as HOSTS  # noqa: E402
from test_elastic import STEPS, WORKER, assert_each_step_once, final_x, replay, sizes_by_step, steps_of

from byteps.testkit import DiscoveryScript, WatchedJob, processes_with_variable, wait_until_dead


def elastic_key(job):
    """The job's elastic key, read from a remote worker's environment (it never appears on a command line)."""
    pid = processes_with_variable("BYTEPS_ELASTIC_WORKER", "w0")[0]
    with open(f"/proc/{pid}/environ", "rb") as f:
        variables = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    return variables[b"BYTEPS_ELASTIC_KEY"].decode()


def test_a_worker_lost_on_one_host_is_replaced_there_and_the_job_loses_nothing(hosts, tmp_path):
    discovery = DiscoveryScript(tmp_path, "\n".join(f"{h}:1" for h in HOSTS))
    flags = ["-np", "2", "--min-np", "1", "--max-np", "2", "--host-discovery-script", discovery.path,
             *hosts.launcher_args()]
    with WatchedJob(flags, WORKER, [str(STEPS), "0.4"]) as job:
        job.wait_for(r"^\[worker 1\] step 3 ", timeout=120)
        key = elastic_key(job)
        ours = processes_with_variable("BYTEPS_ELASTIC_KEY", key)
        assert len(ours) == 2, ours  # one worker on each host, both started over ssh
        [victim] = processes_with_variable("BYTEPS_ELASTIC_WORKER", "w1")
        os.kill(victim, signal.SIGKILL)
        result = job.finish(timeout=180)
    output = result.stdout
    assert result.returncode == 0, output[-6000:]
    assert "rendezvous service for workers on other hosts on 127.0.0.1:" in output, output[-6000:]
    assert "membership epoch 0 (start): 2 worker(s) w0, w1 on 2 host(s) 127.0.0.2, 127.0.0.3" in output
    assert "worker w1 on 127.0.0.3 exited with code 137; going on with 1 worker(s)" in output, output[-6000:]
    # Discovery still reports a slot on 127.0.0.3: a new worker is started there and let in at a commit.
    assert "started worker(s) w2 on 127.0.0.3; they join at the members' next commit" in output, output[-6000:]
    assert "2 worker(s) w0, w2 on 2 host(s) 127.0.0.2, 127.0.0.3" in output, output[-6000:]
    # w0 went on alone from its last commit, then with the newcomer from the commit that let it in (that
    # commit raised HostsUpdatedInterrupt after saving, so its step is not printed).
    lost_at = int(re.search(r"^\[worker 0\] joined 1 rank 0 of 1 at step (\d+)", output, re.M).group(1))
    joined = re.search(r"^\[worker 2\] joined 2 rank 1 of 2 at step (\d+) x (\S+)", output, re.M)
    assert joined, output[-6000:]
    joined_at = int(joined.group(1))
    assert f"[worker 0] joined 2 rank 0 of 2 at step {joined_at} x {joined.group(2)}" in output, output[-6000:]
    records = steps_of(output, 0)
    assert_each_step_once(records, joined_at)
    sizes = [2] * lost_at + [1] * (joined_at - lost_at) + [2] * (STEPS - joined_at)
    assert sizes_by_step(records, 1) == sizes, records
    assert lost_at < joined_at < STEPS
    assert final_x(output, 0) == final_x(output, 2) == replay(sizes)
    assert wait_until_dead(processes_with_variable("BYTEPS_ELASTIC_KEY", key), timeout=10) == []


def test_a_host_without_sshd_is_left_out_and_a_host_that_appears_later_joins(hosts, tmp_path):
    discovery = DiscoveryScript(tmp_path, "127.0.0.2:1\n127.0.0.9:1")
    flags = ["-np", "2", "--min-np", "1", "--host-discovery-script", discovery.path, *hosts.launcher_args()]
    with WatchedJob(flags, WORKER, [str(STEPS), "0.3"]) as job:
        job.wait_for(r"^\[worker 0\] step 2 ", timeout=120)
        discovery.report("127.0.0.2:1\n127.0.0.9:1\n127.0.0.3:1")  # checked over ssh on a thread, then used
        joined = job.wait_for(r"^\[worker 1\] joined 1 rank 1 of 2 at step (\d+) x (\S+)", timeout=60)
        result = job.finish(timeout=120)
    output = result.stdout
    assert result.returncode == 0, output[-6000:]
    assert "host 127.0.0.9: cannot run" in output and "starting no worker there for 30 s" in output, output[-6000:]
    assert "membership epoch 0 (start): 1 worker(s) w0 on 1 host(s) 127.0.0.2" in output, output[-6000:]
    assert "started worker(s) w1 on 127.0.0.3" in output, output[-6000:]
    step = int(joined.group(1))
    assert f"[worker 0] joined 1 rank 0 of 2 at step {step} x {joined.group(2)}" in output, output[-6000:]
    records = steps_of(output, 0)
    assert_each_step_once(records, step)
    sizes = [1] * step + [2] * (STEPS - step)
    assert sizes_by_step(records, 1) == sizes
    assert final_x(output, 0) == final_x(output, 1) == replay(sizes)
