"""A byteps job (scheduler, servers, workers) started process by process on 127.0.0.1, without bpslaunch.

Each process gets the role environment a real machine would give it
(``DMLC_ROLE``, ``DMLC_PS_ROOT_PORT``, ``DMLC_WORKER_ID``, ...), so a test
checks byteps-server and byteps-common on their own, and can stop, kill or
watch any one process. Every process runs in its own session and is killed
with its process group when the job ends, times out or the test fails; the
shared-memory segments its killed workers leave (``/dev/shm/byteps-<job
id>-*``, named by ``BYTEPS_JOB_ID``, which the job gets here unless the
test sets its own) are removed then too, as bpslaunch does.

Example::

    result = run_job([sys.executable, "worker.py"], num_workers=2, num_servers=1)
    assert all(code == 0 for code in result.codes.values()), result.failures()

    job = start_job(worker_argv, 2, 1)        # to act on the job while it runs
    try:
        job.kill("server0")
        job.wait(30, stop_on_failure=False)
    finally:
        result = job.finish()
"""

from __future__ import annotations

import dataclasses
import glob
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from typing import IO, Dict, List, Mapping, Optional, Sequence

from byteps.testkit.ports import free_port
from byteps.testkit.processes import kill_group

__all__ = ["JobResult", "RunningJob", "run_job", "start_job"]

#: The command of the scheduler and of every server (byteps-server's entry point).
SERVER_ARGV = (sys.executable, "-m", "byteps.server")


@dataclasses.dataclass
class JobResult:
    """How each process of a finished job ended, and what it printed (stdout and stderr together)."""

    codes: Dict[str, Optional[int]]  # process name -> exit code (negative: killed by that signal)
    outputs: Dict[str, str]
    timed_out: bool

    def failures(self) -> str:
        """The tail of every process that did not exit 0, for an assertion message."""
        return "\n".join(f"--- {name} exited {self.codes[name]}:\n{self.outputs[name][-3000:]}"
                         for name in self.codes if self.codes[name] != 0)

    def assert_workers_printed(self, line: str, workers: int) -> None:
        """Every process exited 0 in time and worker r printed ``<line> rank <r>``, for each of ``workers``."""
        assert not self.timed_out, self.failures()
        assert all(code == 0 for code in self.codes.values()), self.failures()
        for rank in range(workers):
            assert f"{line} rank {rank}" in self.outputs[f"worker{rank}"], self.outputs[f"worker{rank}"]


#: Where a job's processes share memory: byteps-common's segment names are ``byteps-<job id>-...`` there.
SHM_DIR = "/dev/shm"

#: Seconds the rest of a job may take to exit after its first failure, before finish() kills it.
FAILURE_GRACE_S = 5.0


class RunningJob:
    """The processes of one job, by name (``scheduler``, ``server0``, ``worker1``); ``finish`` leaves none behind."""

    def __init__(self, procs: Dict[str, subprocess.Popen], logs: Dict[str, IO[str]], port: int = 0) -> None:
        self.procs = procs
        self.logs = logs
        self.port = port  # the scheduler's
        self.job_ids: set = set()  # the BYTEPS_JOB_IDs of its processes, whose segments finish() removes

    def output(self, name: str) -> str:
        """What process ``name`` printed so far."""
        handle = self.logs[name]
        handle.flush()
        with open(handle.name) as reader:
            return reader.read()

    def kill(self, name: str) -> None:
        """SIGKILL process ``name`` alone (not its group): what a crash looks like to the others."""
        os.kill(self.procs[name].pid, signal.SIGKILL)

    def wait(self, timeout: float, stop_on_failure: bool = True) -> bool:
        """Wait until every process exited (or, by default, one failed); False on timeout."""
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in self.procs.values()):
            if time.monotonic() > deadline:
                return False
            if stop_on_failure and any(p.poll() not in (None, 0) for p in self.procs.values()):
                self._let_the_others_report(min(FAILURE_GRACE_S, max(0.0, deadline - time.monotonic())))
                return True
            time.sleep(0.05)
        return True

    def _let_the_others_report(self, grace_s: float) -> None:
        """After one process failed, give the workers up to ``grace_s`` to exit with their own view of it.

        Workers that learn of a failure (an error from a server or a local
        peer) exit within about a second; on a loaded machine a fixed short
        pause killed some before they printed. The scheduler and servers
        are not waited for: they notice a lost worker only after the
        heartbeat timeout, and finish() ends them.
        """
        until = time.monotonic() + grace_s
        workers = [p for name, p in self.procs.items() if name.startswith("worker")]
        while time.monotonic() < until and any(p.poll() is None for p in workers):
            time.sleep(0.05)

    def finish(self, timed_out: bool = False) -> JobResult:
        """Kill the process group of whatever still runs, collect the outputs, remove the log files and the
        shared memory the job left."""
        for proc in self.procs.values():
            if proc.poll() is None:
                kill_group(proc.pid)
            proc.wait()
        for job_id in self.job_ids:
            for path in glob.glob(os.path.join(SHM_DIR, f"byteps-{glob.escape(job_id)}-*")):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
        outputs = {}
        for name, handle in self.logs.items():
            handle.seek(0)
            outputs[name] = handle.read()
            handle.close()
            os.unlink(handle.name)
        codes = {name: proc.returncode for name, proc in self.procs.items()}
        return JobResult(codes=codes, outputs=outputs, timed_out=timed_out)


def start_job(worker_argv: Sequence[str], num_workers: int, num_servers: int, local_size: int = 1,
              env: Optional[Mapping[str, str]] = None, timeout: float = 120.0,
              server_argv: Optional[Sequence[str]] = None, start_scheduler: bool = True,
              overrides: Optional[Mapping[str, Mapping[str, str]]] = None) -> RunningJob:
    """Start every process of one job; call ``finish()`` on the result (in a ``finally``).

    ``num_workers`` machines run ``local_size`` worker processes each
    (``worker<w * local_size + local>``); ``env`` adds to every process's
    environment, ``overrides`` maps a process name (``worker1``,
    ``server0``) to extra environment of its own. ``timeout`` becomes the
    rendezvous timeout.
    """
    port = free_port()
    base = dict(os.environ)
    base.update({
        "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
        "DMLC_NUM_WORKER": str(num_workers), "DMLC_NUM_SERVER": str(num_servers),
        "DMLC_INTERFACE": "lo", "PYTHONUNBUFFERED": "1",
        "BYTEPS_RENDEZVOUS_TIMEOUT": str(int(timeout)),
        "BYTEPS_JOB_ID": f"test{port}x{secrets.token_hex(4)}",
    })
    base.update(env or {})
    server_cmd = list(server_argv or SERVER_ARGV)
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
            if env_of.get("BYTEPS_JOB_ID", "").strip():
                job.job_ids.add(env_of["BYTEPS_JOB_ID"].strip())
            job.procs[name] = subprocess.Popen(argv, env=env_of, stdout=job.logs[name],
                                               stderr=subprocess.STDOUT, start_new_session=True)
    except BaseException:
        job.finish()
        raise
    return job


def run_job(worker_argv: Sequence[str], num_workers: int, num_servers: int, local_size: int = 1,
            env: Optional[Mapping[str, str]] = None, timeout: float = 120.0,
            server_argv: Optional[Sequence[str]] = None, start_scheduler: bool = True,
            overrides: Optional[Mapping[str, Mapping[str, str]]] = None) -> JobResult:
    """Run one job until every process exited, one failed, or ``timeout``; every process is gone on return.
    ``overrides``: extra environment of single processes, as for :func:`start_job`."""
    job = start_job(worker_argv, num_workers, num_servers, local_size, env, timeout, server_argv, start_scheduler,
                    overrides)
    timed_out = True
    try:
        timed_out = not job.wait(timeout)
    finally:
        result = job.finish(timed_out)
    return result


def _log_path(name: str, port: int) -> str:
    return os.path.join(tempfile.gettempdir(), f"byteps-test-{port}-{name}.log")
