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

__all__ = ["JobResult", "run_job", "free_port"]


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


def run_job(worker_argv: Sequence[str], num_workers: int, num_servers: int, local_size: int = 1,
            env: Optional[Dict[str, str]] = None, timeout: float = 120.0,
            server_argv: Optional[Sequence[str]] = None, start_scheduler: bool = True) -> JobResult:
    """Run one job to completion; every process is gone when this returns."""
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
    procs: Dict[str, subprocess.Popen] = {}
    logs: Dict[str, object] = {}
    try:
        for name, argv, extra in plan:
            logs[name] = open(_log_path(name, port), "w+")
            procs[name] = subprocess.Popen(argv, env={**base, **extra}, stdout=logs[name],
                                           stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        timed_out = False
        while any(p.poll() is None for p in procs.values()):
            if time.monotonic() > deadline:
                timed_out = True
                break
            if any(p.poll() not in (None, 0) for p in procs.values()):
                time.sleep(0.5)  # let the others report their view of the failure
                break
            time.sleep(0.05)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                _kill_group(proc)
            proc.wait()
    outputs = {}
    for name, handle in logs.items():
        handle.seek(0)
        outputs[name] = handle.read()
        handle.close()
        os.unlink(handle.name)
    codes = {name: proc.returncode for name, proc in procs.items()}
    return JobResult(codes=codes, outputs=outputs, timed_out=timed_out)


def _log_path(name: str, port: int) -> str:
    return os.path.join(tempfile.gettempdir(), f"byteps-test-{port}-{name}.log")
