"""Starting one child of the job so that it can never outlive bpslaunch.

Each child gets its own session and process group (so one ``killpg``
reaches it and everything it started), pipes for stdout and stderr (relayed
with a prefix), and, in ``preexec_fn`` between fork and exec, a
parent-death signal (if bpslaunch dies, even by SIGKILL, the kernel sends
the child that signal) and, when the spec has ``cpus``, its CPU affinity.

Example::

    child = ChildProcess.spawn(spec)
    child.proc.wait()
    print(describe_exit(child.proc.returncode))   # "exited with code 0"
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from typing import Any, Optional

from byteps.launcher import _C
from byteps.launcher.cpu_placement import pin_in_child
from byteps.launcher.job_plan import ProcessSpec
from byteps.launcher.ssh import SshOptions, remote_argv, remote_request

__all__ = ["ChildProcess", "describe_exit", "exit_status", "DEATH_SIGNAL"]

#: SIGKILL rather than SIGTERM: a child that ignores SIGTERM must not survive
#: its launcher either.
DEATH_SIGNAL = signal.SIGKILL


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def describe_exit(returncode: int) -> str:
    """Human words for a Popen returncode: ``exited with code 3``, ``was killed by SIGSEGV``."""
    if returncode < 0:
        return f"was killed by {_signal_name(-returncode)} (signal {-returncode})"
    return f"exited with code {returncode}"


def exit_status(returncode: int) -> int:
    """The shell convention: the code itself, 128 + N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


@dataclasses.dataclass
class ChildProcess:
    """A started child: its spec, its Popen and what became of it."""

    spec: ProcessSpec
    proc: subprocess.Popen
    started_at: float
    ended_at: Optional[float] = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def pgid(self) -> int:
        """The child leads its own session, so its group id is its pid."""
        return self.proc.pid

    @property
    def returncode(self) -> Optional[int]:
        return self.proc.returncode

    @property
    def running(self) -> bool:
        return self.proc.returncode is None

    def poll(self) -> Optional[int]:
        """Reap the child if it has exited (records when we noticed)."""
        returncode = self.proc.poll()
        if returncode is not None and self.ended_at is None:
            self.ended_at = time.monotonic()
        return returncode

    @classmethod
    def spawn(
        cls, spec: ProcessSpec, *, inherit_stdin: bool = False, death_signal: int = DEATH_SIGNAL, ssh: Any = None
    ) -> ChildProcess:
        """Start ``spec``; raises OSError if the command cannot be executed.

        Call from the thread that will outlive the child: Linux sends the
        parent-death signal when the *thread* that forked exits. A spec
        with a ``host`` starts as ``ssh`` to it (``ssh``: the plan's
        :class:`~byteps.launcher.ssh.SshOptions`): its command and
        environment go down ssh's standard input, which stays open until
        the child is gone (:mod:`byteps.launcher.remote`).
        """
        parent = os.getpid()

        def before_exec() -> None:
            _C.set_parent_death_signal(int(death_signal), parent)
            if spec.cpus:
                pin_in_child(spec.cpus)

        argv, env, stdin = list(spec.argv), dict(spec.env), None if inherit_stdin else subprocess.DEVNULL
        if spec.host is not None:
            argv, env, stdin = remote_argv(spec.host, ssh or SshOptions()), dict(os.environ), subprocess.PIPE
        proc = subprocess.Popen(
            argv,
            env=env,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=before_exec,
            close_fds=True,
        )
        if spec.host is not None:  # the request, then the pipe stays open: its end is the child's end
            try:
                proc.stdin.write(remote_request(spec.argv, spec.env))
                proc.stdin.flush()
            except BrokenPipeError:
                pass  # ssh already failed: its exit status says why
        return cls(spec=spec, proc=proc, started_at=time.monotonic())
