"""Role mode ends as BytePS's does: scheduler and servers exit once every worker has shut down.

BytePS's own tests start the scheduler and a server with ``bpslaunch``
(DMLC_ROLE=scheduler / server), run the worker in the test process, call
``shutdown()`` and then join the scheduler before the process exits. These
tests do the same with real processes on 127.0.0.1: the worker stays alive
after its shutdown() until the scheduler and server have exited.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Dict, List

import numpy as np
import pytest

from byteps.testkit import LAUNCHER, clean_env, free_port, kill_group

WORKER = os.path.join(os.path.dirname(__file__), "role_mode_worker.py")
#: Generous: what is checked is that the processes end, not how fast.
END_DEADLINE_S = 60.0


def _start(argv: List[str], env: Dict[str, str], stdin=None) -> subprocess.Popen:
    return subprocess.Popen(argv, env=env, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _wait_all(procs: List[subprocess.Popen], deadline_s: float) -> bool:
    until = time.monotonic() + deadline_s
    while any(p.poll() is None for p in procs):
        if time.monotonic() > until:
            return False
        time.sleep(0.1)
    return True


@pytest.fixture
def role_job():
    """Starts scheduler and server (role-mode bpslaunch) and workers; kills every process group at the end."""
    started: List[subprocess.Popen] = []
    port = free_port()
    base = clean_env({"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port), "DMLC_NUM_WORKER": "1",
                      "DMLC_NUM_SERVER": "1", "DMLC_INTERFACE": "lo", "PS_HEARTBEAT_INTERVAL": "0.5",
                      "PS_HEARTBEAT_TIMEOUT": "3"})

    def start(worker_args: List[str] = ()) -> Dict[str, subprocess.Popen]:
        procs = {role: _start([*LAUNCHER], {**base, "DMLC_ROLE": role}) for role in ("scheduler", "server")}
        worker_env = {**base, "DMLC_ROLE": "worker", "DMLC_WORKER_ID": "0", "BYTEPS_FORCE_DISTRIBUTED": "1"}
        procs["worker"] = _start([sys.executable, WORKER, *worker_args], worker_env, stdin=subprocess.PIPE)
        started.extend(procs.values())
        return procs

    yield start
    for proc in started:
        if proc.poll() is None:
            kill_group(proc.pid)
        proc.wait()


def _output(proc: subprocess.Popen) -> str:
    return proc.stdout.read() if proc.poll() is not None else "(still running)"


def test_scheduler_and_server_end_once_the_worker_shut_down(role_job):
    procs = role_job()
    roles = [procs["scheduler"], procs["server"]]
    ended = _wait_all(roles, END_DEADLINE_S)
    worker_alive = procs["worker"].poll() is None
    procs["worker"].stdin.close()  # now the worker may exit, as BytePS's test process does after the join
    assert _wait_all([procs["worker"]], END_DEADLINE_S)
    worker_out = _output(procs["worker"])
    assert ended, f"scheduler/server still running after the worker's shutdown():\n{worker_out}"
    assert worker_alive, f"the worker exited before the job ended:\n{worker_out}"
    for role, proc in procs.items():
        assert proc.returncode == 0, f"{role} exited {proc.returncode}:\n{_output(proc)}"
    result = next(line for line in worker_out.splitlines() if line.startswith("RESULT"))
    np.testing.assert_array_equal(np.array(result.split()[1:], dtype=np.float32), np.arange(8, dtype=np.float32))
    assert "LEFT" in worker_out


def test_a_lost_worker_ends_scheduler_and_server_with_an_error(role_job):
    procs = role_job(["die"])
    assert _wait_all(list(procs.values()), END_DEADLINE_S), "a lost worker left the scheduler or server running"
    assert procs["worker"].returncode < 0
    for role in ("scheduler", "server"):
        assert procs[role].returncode not in (0, None), f"{role} exited 0 after a lost worker:\n{_output(procs[role])}"
