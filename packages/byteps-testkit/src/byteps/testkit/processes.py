"""Looking at and killing the processes a test started, so that none outlives it.

Tests start each job process in a session of its own
(``start_new_session=True``): a signal meant for the job never reaches
pytest, and :func:`kill_group` takes the process together with everything it
forked.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import List, Optional, Sequence

__all__ = ["kill_group", "process_state", "is_alive", "wait_until_dead"]


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid``; nothing happens when it is already gone."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def stop_group(process: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM the process group ``process`` leads, SIGKILL it after ``timeout`` s, and reap ``process``."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(process.pid)
        process.wait()


def process_state(pid: int) -> Optional[str]:
    """The /proc state letter of ``pid`` (``R``, ``S``, ``Z``...), or None when it no longer exists."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


def is_alive(pid: int) -> bool:
    """Running or sleeping; a zombie (dead, not yet reaped by its parent) counts as dead."""
    return process_state(pid) not in (None, "Z", "X")


def wait_until_dead(pids: Sequence[int], timeout: float) -> List[int]:
    """Wait up to ``timeout`` seconds for ``pids`` to die; returns those still alive."""
    deadline = time.monotonic() + timeout
    alive = [p for p in pids if is_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if is_alive(p)]
    return alive
