"""A bpslaunch job a test watches while it runs: wait for a line, find a process by its variables, kill it.

For the elastic tests: they kill one process of a running job at a chosen
moment (``kill -9``, as a lost machine would be) and check what the rest
of the job does. bpslaunch runs in a session of its own; whatever happens,
:meth:`WatchedJob.close` takes its whole process group down.

Example::

    with WatchedJob(["-np", "3", "--min-np", "2"], "train.py") as job:
        job.wait_for(r"\\[worker 1\\] step 5 ")
        os.kill(job.child_pid("BYTEPS_ELASTIC_WORKER", "w1"), signal.SIGKILL)
        result = job.finish(timeout=120)
    assert result.returncode == 0
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from typing import List, Mapping, Optional, Sequence

from byteps.testkit.environment import clean_env
from byteps.testkit.launched_job import LAUNCHER
from byteps.testkit.processes import kill_group

__all__ = ["WatchedJob", "DiscoveryScript", "children_with_variable", "processes_with_variable", "variable_of"]


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[1])


def _with_variable(name: str, value: str, parent: Optional[int] = None) -> List[int]:
    wanted = f"{name}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if parent is not None and _parent_of(int(entry)) != parent:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if wanted in f.read().split(b"\0"):
                    found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
    return found


def children_with_variable(parent: int, name: str, value: str) -> List[int]:
    """The pids of ``parent``'s children whose environment has ``name=value``."""
    return _with_variable(name, value, parent)


def processes_with_variable(name: str, value: str) -> List[int]:
    """The pids of every process here (but this one) whose environment has ``name=value``: e.g. a job's
    processes started over ssh on loopback "hosts", which are nobody's children here."""
    return _with_variable(name, value)


def variable_of(pid: int, name: str) -> str:
    """``name`` in process ``pid``'s environment as it started ('' when unset, or the process is gone): e.g.
    which DMLC_ROLE each process of a job found by :func:`processes_with_variable` has."""
    prefix = f"{name}=".encode()
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:
        return ""
    return next((entry[len(prefix):].decode(errors="replace") for entry in entries if entry.startswith(prefix)), "")


class WatchedJob:
    """``bpslaunch --grace-period 2 <flags> -- python <script> <args>``, its output read as it comes."""

    def __init__(self, flags: Sequence[str], script: str, args: Sequence[str] = (),
                 env: Optional[Mapping[str, str]] = None) -> None:
        command = [*LAUNCHER, "--grace-period", "2", *flags, "--", sys.executable, script, *args]
        settings = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
        self.process = subprocess.Popen(command, env=clean_env(settings), stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: List[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def output(self) -> str:
        with self._changed:
            return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 120.0, after: int = 0) -> re.Match:
        """The first line from index ``after`` on that matches ``pattern``; AssertionError with the output if none."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        seen = after
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    match = regex.search(line)
                    if match:
                        return match
                seen = len(self.lines)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.process.poll() is not None and not self._reader.is_alive()):
                    tail = "\n".join(self.lines[-60:])
                    raise AssertionError(f"no line matching {pattern!r} within {timeout:g} s "
                                         f"(bpslaunch exit {self.process.poll()}):\n{tail}")
                self._changed.wait(min(remaining, 0.5))

    def child_pid(self, name: str, value: str) -> int:
        """The one child of bpslaunch whose environment has ``name=value``."""
        pids = children_with_variable(self.process.pid, name, value)
        assert len(pids) == 1, f"children of bpslaunch with {name}={value}: {pids}"
        return pids[0]

    def finish(self, timeout: float) -> subprocess.CompletedProcess:
        """Wait for bpslaunch to exit (killing it after ``timeout``); its exit status and whole output."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.close()
            raise AssertionError(f"bpslaunch still running after {timeout:g} s:\n"
                                 + "\n".join(self.lines[-60:])) from None
        self._reader.join(10)
        return subprocess.CompletedProcess(self.process.args, self.process.returncode, self.output, "")

    def close(self) -> None:
        kill_group(self.process.pid)
        self.process.wait()

    def __enter__(self) -> WatchedJob:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class DiscoveryScript:
    """A host discovery script for ``bpslaunch --host-discovery-script`` whose answer a test sets.

    Example::

        discovery = DiscoveryScript(tmp_path, "localhost:2")
        flags = ["--host-discovery-script", discovery.path]
        discovery.report("localhost:3")     # from the next run of the script on
    """

    def __init__(self, folder: os.PathLike, hosts: str) -> None:
        self._answer = os.path.join(folder, "discovered-hosts")
        self.path = os.path.join(folder, "discover-hosts.sh")
        self.report(hosts)
        with open(self.path, "w") as script:
            script.write(f"#!/bin/sh\ncat '{self._answer}'\n")
        os.chmod(self.path, 0o755)

    def report(self, hosts: str) -> None:
        """What the script prints from now on (``host:slots`` lines)."""
        temporary = self._answer + ".new"
        with open(temporary, "w") as out:
            out.write(hosts.rstrip("\n") + "\n")
        os.replace(temporary, self._answer)  # never half a file for a run in between
