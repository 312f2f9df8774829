"""bpslaunch over ssh (-H / --hostfile) against real sshd servers, one per loopback address.

The "hosts" are 127.0.0.2 and 127.0.0.3, each with an OpenSSH server of
its own (byteps.testkit.SshHosts); every process of the job is started
through ssh, as on a real cluster. The session that runs these
(`nox -s tests-engines`) installs openssh-server from Debian's packages.
"""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from byteps.testkit import clean_env, rank_lines

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "..", "examples", "torch")
from conftest import SSH_HOSTS as HOSTS  # noqa: E402
from launcher_harness import left_of_job, processes_of, running_worker_pids  # noqa: E402


def bpslaunch(hosts, layout, script, args=(), env=None):
    return [sys.executable, "-m", "byteps.launcher", "--grace-period", "2", *layout, *hosts.launcher_args(), "--",
            sys.executable, script, *args], clean_env({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})})



def test_two_hosts_of_two_slots_train_the_digits_example(hosts):
    pytest.importorskip("torch")
    argv, env = bpslaunch(hosts, ["-H", "127.0.0.2:2,127.0.0.3:2"], os.path.join(EXAMPLES, "train_digits.py"),
                          ["--epochs", "4", "--min-accuracy", "0.85"])
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "job over ssh" in output and "2 hosts x 2: 127.0.0.2, 127.0.0.3" in output, output[-3000:]
    assert "4 worker processes on 2 machines" in output
    text = "\n".join(rank_lines(result.stdout, 0))
    assert float(re.search(r"held-out accuracy (\S+)", text).group(1)) >= 0.85, text


def test_a_hostfile_and_dedicated_server_hosts(hosts, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# workers\n127.0.0.2 slots=1\n")
    argv, env = bpslaunch(hosts, ["--hostfile", str(hostfile), "--server-hosts", "127.0.0.3"],
                          os.path.join(EXAMPLES, "hello_allreduce.py"))
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "1 server, 1 worker process (1 host x 1: 127.0.0.2)" in result.stderr, result.stderr[-3000:]


def test_max_restarts_starts_the_whole_job_again_on_every_host(hosts):
    job_id = "sshrestart1"
    argv, env = bpslaunch(hosts, ["-H", "127.0.0.2:1,127.0.0.3:1", "--max-restarts", "1"],
                          os.path.join(HERE, "ssh_restart_worker.py"), env={"BYTEPS_JOB_ID": job_id})
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "attempt 1 of 2 failed (worker 1" in result.stderr and "exited with code 4" in result.stderr, output
    for rank, host in enumerate(HOSTS):
        assert f"ATTEMPT 1 rank {rank} host {host} sum 2" in result.stdout, output[-4000:]
    assert "restarted 1 time" in result.stderr, output[-2000:]
    assert processes_of(job_id) == []


def test_killing_a_remote_worker_ends_the_job_and_leaves_no_process_on_any_host(hosts):
    job_id = f"ssh{os.getpid()}"
    argv, env = bpslaunch(hosts, ["-H", "127.0.0.2:1,127.0.0.3:1"], os.path.join(HERE, "ssh_job_worker.py"),
                          env={"BYTEPS_JOB_ID": job_id})
    launcher = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    lines = []
    try:
        pids = running_worker_pids(launcher.stdout, lines, job_id)
        os.kill(pids[1], signal.SIGKILL)  # worker 1 lives on 127.0.0.3
        killed = time.monotonic()
        rest, _ = launcher.communicate(timeout=30)
        ended = time.monotonic() - killed
        assert ended < 15, "".join(lines) + rest
        assert launcher.returncode != 0, "".join(lines) + rest
        assert "worker 1" in rest and "on 127.0.0.3" in rest, rest
        left = left_of_job(job_id, killed)  # the promise: nothing left by 15 s
        print(f"bpslaunch ended {ended:.1f} s after the kill, the job's last process {time.monotonic() - killed:.1f} s")
        assert left == {}, f"processes of the job outlived it by 15 s: {left}"
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()


@pytest.mark.parametrize("layout,fragment", [
    (["-H", "127.0.0.2:2,127.0.0.3:1"], "every host must run the same number of worker processes"),
    (["-H", "127.0.0.2:0"], "has 0 slots"),
    (["-H", "127.0.0.2:x"], "slots must be a whole number"),
    (["-H", "127.0.0.2:1", "--servers", "2"], "--servers 2: between 1 and the 1 worker hosts"),
    (["-H", "127.0.0.9:1"], "127.0.0.9: cannot run"),
    (["-H", "127.0.0.2:1", "-np", "2"], "-np do not apply with -H/--hostfile"),
    (["-H", "127.0.0.2:1", "--remote-python", "/usr/bin/python3"], "byteps-launcher is not installed"),
])
def test_bad_host_lists_are_refused_before_anything_starts(hosts, layout, fragment):
    argv, env = bpslaunch(hosts, layout, os.path.join(EXAMPLES, "hello_allreduce.py"))
    started = time.monotonic()
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert fragment in result.stderr, result.stderr
    assert time.monotonic() - started < 30


def test_a_host_with_another_byteps_launcher_version_is_named_and_nothing_starts(hosts, tmp_path):
    """127.0.0.3's Python finds byteps-launcher 9.9.9 first (a distribution's metadata ahead on its path):
    host_problems names that host and its version, not the other; bpslaunch refuses before starting anything."""
    from byteps.common.interface import distribution_version
    from byteps.launcher.ssh import SshOptions, host_problems

    other = tmp_path / "other-version" / "byteps_launcher-9.9.9.dist-info"
    other.mkdir(parents=True)
    (other / "METADATA").write_text("Metadata-Version: 2.1\nName: byteps-launcher\nVersion: 9.9.9\n")
    # One interpreter path on every host, as with Horovod; what it finds depends on the host ssh reached
    # (SSH_CONNECTION's third field is the server's address). PYTHONPATH: this test's own byteps, if any.
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n"
                      f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}\n"
                      f'case "$SSH_CONNECTION" in *" 127.0.0.3 "*) PYTHONPATH={other.parent}:$PYTHONPATH;; esac\n'
                      f'export PYTHONPATH\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    here = distribution_version("byteps-launcher")
    options = SshOptions(port=hosts.port, identity_file=hosts.key, options=tuple(hosts.ssh_options()),
                         python=str(python))
    problems = host_problems(HOSTS, options, here)
    assert list(problems) == ["127.0.0.3"], problems
    assert f"has byteps-launcher 9.9.9, this host {here}" in problems["127.0.0.3"], problems
    # And a host with the same version as this one passes: the check compares, it does not just refuse.
    assert host_problems(HOSTS, options, "9.9.9") == {"127.0.0.2": f"has byteps-launcher {here}, this host 9.9.9: "
                                                                    "install the same version everywhere"}

    job_id = f"sshversion{os.getpid()}"
    argv, env = bpslaunch(hosts, ["-H", "127.0.0.2:1,127.0.0.3:1", "--remote-python", str(python)],
                          os.path.join(EXAMPLES, "hello_allreduce.py"), env={"BYTEPS_JOB_ID": job_id})
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "127.0.0.3: has byteps-launcher 9.9.9" in result.stderr and "127.0.0.2:" not in result.stderr, \
        result.stderr
    assert processes_of(job_id) == []
