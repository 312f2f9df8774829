"""Test harness: run bpslaunch as a real process, track every pid a job starts, clean up.

Ports, environments and process states come from byteps.testkit; what is
here is bpslaunch's own: the pid records, a launcher with stand-in servers,
and the parsing of environment dumps.

Children record their pids by appending to ``$BPSTEST_PIDDIR/pids``;
:meth:`Job.cleanup` (run by the ``job`` fixture in conftest.py) SIGKILLs
whatever is still alive at the end of a test, even a failed one, but only
processes whose environment carries that directory (so a reused pid of
someone else is never touched).
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Dict, List, Optional, Sequence

from byteps.testkit import LAUNCHER, clean_env, is_alive, processes_with_variable, variable_of

PY = sys.executable

#: Distributed-looking settings for role-mode workers whose command never connects.
ROLE_WORKER_ENV = {
    "DMLC_ROLE": "worker",
    "DMLC_PS_ROOT_URI": "127.0.0.1",
    "DMLC_PS_ROOT_PORT": "9",
    "DMLC_NUM_SERVER": "1",
}


def with_fake_server(server_code: str) -> List[str]:
    """A bpslaunch command line whose scheduler and servers run ``python -c server_code``.

    Lets tests check the distributed path (roles, environment, teardown)
    without depending on the real byteps.server.
    """
    patch = (
        "import sys; import byteps.launcher.embedded_mode as e, byteps.launcher.role_mode as r; "
        "e.SERVER_ARGV = r.SERVER_ARGV = (sys.executable, '-c', sys.argv[1]); "
        "from byteps.launcher.cli import main; sys.exit(main(sys.argv[2:]))"
    )
    return [PY, "-c", patch, server_code]


def processes_of(job_id: str) -> List[int]:
    """Pids of the processes whose environment names this job (every "host" and node lives here)."""
    return processes_with_variable("BYTEPS_JOB_ID", job_id)


def running_worker_pids(stream: IO[str], lines: List[str], job_id: str, workers: int = 2, servers: int = 2,
                        timeout: float = 90) -> Dict[int, int]:
    """{rank: pid} of a job of ssh_job_worker.py, read from its output (kept in ``lines``) once every worker
    printed ``PID <rank> <pid>``; checks that the job's scheduler, servers and workers all run by then."""
    pids, deadline = {}, time.monotonic() + timeout
    while len(pids) < workers:
        line = stream.readline()
        assert line and time.monotonic() < deadline, "".join(lines)
        lines.append(line)
        found = re.search(r"PID (\d+) (\d+)", line)
        if found:
            pids[int(found.group(1))] = int(found.group(2))
    roles = collections.Counter(variable_of(pid, "DMLC_ROLE") for pid in processes_of(job_id))
    assert roles["scheduler"] == 1 and roles["server"] == servers and roles["worker"] == workers, roles
    return pids


def left_of_job(job_id: str, since: float, limit: float = 15) -> Dict[int, Optional[str]]:
    """The job's processes (pid: role) still there ``limit`` seconds after ``since`` (waits until then or none)."""
    while processes_of(job_id) and time.monotonic() - since < limit:
        time.sleep(0.1)
    return {pid: variable_of(pid, "DMLC_ROLE") for pid in processes_of(job_id)}


class Job:
    """One test's jobs: launches bpslaunch and knows every pid its children recorded."""

    def __init__(self, piddir: Path) -> None:
        self.piddir = piddir
        self.launched: List[subprocess.Popen] = []

    def env(self, **extra: str) -> Dict[str, str]:
        return clean_env({"BPSTEST_PIDDIR": str(self.piddir), **extra})

    def start(
        self, args: Sequence[str], env: Optional[Dict[str, str]] = None, launcher: Sequence[str] = LAUNCHER
    ) -> subprocess.Popen:
        proc = subprocess.Popen(
            [*launcher, *args],
            env=env if env is not None else self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a stray signal to the launcher's group must not hit pytest
        )
        self.launched.append(proc)
        return proc

    def run(
        self,
        args: Sequence[str],
        env: Optional[Dict[str, str]] = None,
        timeout: float = 20,
        launcher: Sequence[str] = LAUNCHER,
    ):
        proc = self.start(args, env, launcher)
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out.decode(), err.decode()

    def wait_for_pids(self, count: int, timeout: float = 10) -> List[int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = self.pids()
            if len(pids) >= count:
                return pids
            time.sleep(0.05)
        raise AssertionError(f"expected {count} recorded pids, got {self.pids()}")

    def pids(self) -> List[int]:
        path = self.piddir / "pids"
        if not path.exists():
            return []
        return [int(word) for word in path.read_text().split()]

    def _ours(self, pid: int) -> bool:
        try:
            return str(self.piddir).encode() in Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return False

    def cleanup(self) -> None:
        for proc in self.launched:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream:
                    stream.close()
        for pid in self.pids():
            if is_alive(pid) and self._ours(pid):
                os.kill(pid, signal.SIGKILL)


def env_lines(output: str) -> Dict[str, dict]:
    """Parse ``[prefix] {json}`` lines printed by env-dumping children, keyed by prefix."""
    found = {}
    for line in output.splitlines():
        prefix, _, rest = line.partition("] ")
        if rest.startswith("{"):
            found[prefix + "]"] = json.loads(rest)
    return found


#: A command that prints its environment as one JSON line.
PRINT_ENV = [PY, "-c", "import json, os; print(json.dumps(dict(os.environ)))"]

#: Shell snippet: record this process and a background grandchild.
RECORD_PIDS = 'echo $$ >> "$BPSTEST_PIDDIR/pids"; sleep 300 & echo $! >> "$BPSTEST_PIDDIR/pids"; '
