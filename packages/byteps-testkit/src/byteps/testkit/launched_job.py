"""A script run by the real ``bpslaunch``, and what each of its worker ranks printed.

The tests of the framework adapters (and of the examples) go through here,
so the launcher, scheduler, servers and workers are the real ones, on
127.0.0.1 with ports the launcher picks free. When a process fails the
launcher tears the job down; when ``timeout`` passes, bpslaunch gets SIGTERM
and tears the job down itself (its processes, their shared-memory
segments), and SIGKILL only if it has not ended 10 s later (the kernel then
takes its children with it: bpslaunch sets their parent-death signal).

Example::

    result = launch_job(JOB_LAYOUTS["one-machine-np2"], "ops_checks.py")
    assert_all_ok(result, checks=10)
    rank_lines(result.stdout, 1)              # what worker rank 1 printed
"""

from __future__ import annotations

import subprocess
import sys
from typing import List, Mapping, Optional, Sequence

from byteps.testkit.environment import clean_env

__all__ = ["JOB_LAYOUTS", "LAUNCHER", "launch_job", "rank_lines", "report", "assert_all_ok", "tail"]

#: ``python -m byteps.launcher``: bpslaunch of the interpreter running the tests.
LAUNCHER = (sys.executable, "-m", "byteps.launcher")

#: The two layouts every multi-worker script must work under: one machine, and two machines with two servers.
JOB_LAYOUTS = {
    "one-machine-np2": ["-np", "2"],
    "two-machines-two-servers": ["--workers", "2", "--servers", "2"],
}


def launch_job(layout: Sequence[str], script: str, args: Sequence[str] = (),
               env: Optional[Mapping[str, str]] = None, timeout: float = 120,
               drop: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """``bpslaunch --grace-period 2 <layout> -- python <script> <args>``, output captured as text.

    The environment is :func:`~byteps.testkit.environment.clean_env` (minus
    the ``drop`` prefixes too), unbuffered and one OpenMP thread per
    process, plus ``env``.
    """
    command = [*LAUNCHER, "--grace-period", "2", *layout, "--", sys.executable, script, *args]
    settings = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    with subprocess.Popen(command, env=clean_env(settings, drop=drop), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as launcher:
        try:
            stdout, stderr = launcher.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            launcher.terminate()  # bpslaunch ends its job and removes what the job left in /dev/shm
            try:
                stdout, stderr = launcher.communicate(timeout=_TEARDOWN_S)
            except subprocess.TimeoutExpired:
                launcher.kill()
                stdout, stderr = launcher.communicate()
            raise subprocess.TimeoutExpired(command, timeout, output=stdout, stderr=stderr) from None
    return subprocess.CompletedProcess(command, launcher.returncode, stdout, stderr)


#: How long a timed-out bpslaunch may take to end its job after SIGTERM before it is killed.
_TEARDOWN_S = 10


def rank_lines(output: str, rank: int) -> List[str]:
    """Lines printed by one worker rank (bpslaunch prefixes them with ``[worker N] ``), prefix removed."""
    prefix = f"[worker {rank}] "
    return [line[len(prefix):] for line in output.splitlines() if line.startswith(prefix)]


def tail(text: str, lines: int = 60) -> str:
    """The last ``lines`` lines of ``text``."""
    return "\n".join(text.splitlines()[-lines:])


def report(result: subprocess.CompletedProcess) -> str:
    """Exit status and the ends of stdout and stderr, for an assertion message."""
    return f"exit {result.returncode}\n--- stdout\n{result.stdout[-8000:]}\n--- stderr\n{result.stderr[-4000:]}"


def assert_all_ok(result: subprocess.CompletedProcess, checks: int, ranks: int = 2) -> None:
    """The job exited 0 and every rank printed ``ALL OK <checks>``; else show what they printed."""
    assert result.returncode == 0, report(result)
    for rank in range(ranks):
        assert f"ALL OK {checks}" in rank_lines(result.stdout, rank), report(result)
