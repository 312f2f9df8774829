"""Start a real byteps job (scheduler, servers, workers) as processes on 127.0.0.1.

The tests of byteps-server use it instead of bpslaunch, so that the server
is tested on its own; every process is started in its own session and
killed by process group when the job ends, times out or a test fails.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

__all__ = ["JobResult", "RunningJob", "run_job", "start_job", "free_port"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclasses.dataclass
class JobResult:
    codes: Dict[str, Optional[int]]  # role name -> exit code (None: killed at timeout)
    outputs: Dict[str, str]
    timed_out: bool

    def failures(self) -> str:
        return "\n".join(f"--- {name} exited {self.codes[name]}:\n{self.outputs[name][-3000:]}"
                         for name in self.codes if self.codes[name] != 0)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class RunningJob:
    """Processes of one job, started by :func:`start_job`; ``finish`` always leaves none behind."""

    def __init__(self, procs: Dict[str, subprocess.Popen], logs: Dict[str, object], port: int = 0) -> None:
        self.procs = procs
        self.logs = logs
        self.port = port  # the scheduler's

    def output(self, name: str) -> str:
        handle = self.logs[name]
        handle.flush()
        with open(handle.name) as reader:
            return reader.read()

    def kill(self, name: str) -> None:
        os.kill(self.procs[name].pid, signal.SIGKILL)

    def wait(self, timeout: float, stop_on_failure: bool = True) -> bool:
        """Wait until every process exited (or, by default, one failed); False on timeout."""
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in self.procs.values()):
            if time.monotonic() > deadline:
                return False
            if stop_on_failure and any(p.poll() not in (None, 0) for p in self.procs.values()):
                time.sleep(0.5)  # let the others report their view of the failure
                return True
            time.sleep(0.05)
        return True

    def finish(self, timed_out: bool = False) -> JobResult:
        for proc in self.procs.values():
            if proc.poll() is None:
                _kill_group(proc)
            proc.wait()
        outputs = {}
        for name, handle in self.logs.items():
            handle.seek(0)
            outputs[name] = handle.read()
            handle.close()
            os.unlink(handle.name)
        codes = {name: proc.returncode for name, proc in self.procs.items()}
        return JobResult(codes=codes, outputs=outputs, timed_out=timed_out)


def start_job(worker_argv: Sequence[str], num_workers: int, num_servers: int, local_size: int = 1,
              env: Optional[Dict[str, str]] = None, timeout: float = 120.0,
              server_argv: Optional[Sequence[str]] = None, start_scheduler: bool = True,
              overrides: Optional[Dict[str, Dict[str, str]]] = None) -> RunningJob:
    """Start every process of one job; call ``finish()`` on the result (in a finally).

    ``overrides`` maps a process name (``worker1``, ``server0``) to extra environment.
    """
    port = free_port()
    base = dict(os.environ)
    base.update({
        "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
        "DMLC_NUM_WORKER": str(num_workers), "DMLC_NUM_SERVER": str(num_servers),
        "DMLC_INTERFACE": "lo", "PYTHONUNBUFFERED": "1",
        "BYTEPS_RENDEZVOUS_TIMEOUT": str(int(timeout)),
    })
    base.update(env or {})
    server_cmd = list(server_argv or [sys.executable, "-m", "byteps.server"])
    plan: List[tuple] = []
    if start_scheduler:
        plan.append(("scheduler", server_cmd, {"DMLC_ROLE": "scheduler"}))
    plan += [(f"server{s}", server_cmd, {"DMLC_ROLE": "server"}) for s in range(num_servers)]
    for w in range(num_workers):
        for local in range(local_size):
            plan.append((f"worker{w * local_size + local}", list(worker_argv), {
                "DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(w),
                "BYTEPS_LOCAL_RANK": str(local), "BYTEPS_LOCAL_SIZE": str(local_size)}))
    job = RunningJob({}, {}, port)
    try:
        for name, argv, extra in plan:
            job.logs[name] = open(_log_path(name, port), "w+")
            env_of = {**base, **extra, **(overrides or {}).get(name, {})}
            job.procs[name] = subprocess.Popen(argv, env=env_of, stdout=job.logs[name],
                                               stderr=subprocess.STDOUT, start_new_session=True)
    except BaseException:
        job.finish()
        raise
    return job


def run_job(worker_argv: Sequence[str], num_workers: int, num_servers: int, local_size: int = 1,
            env: Optional[Dict[str, str]] = None, timeout: float = 120.0,
            server_argv: Optional[Sequence[str]] = None, start_scheduler: bool = True) -> JobResult:
    """Run one job to completion; every process is gone when this returns."""
    job = start_job(worker_argv, num_workers, num_servers, local_size, env, timeout, server_argv, start_scheduler)
    timed_out = True
    try:
        timed_out = not job.wait(timeout)
    finally:
        result = job.finish(timed_out)
    return result


def _log_path(name: str, port: int) -> str:
    return os.path.join(tempfile.gettempdir(), f"byteps-test-{port}-{name}.log")
