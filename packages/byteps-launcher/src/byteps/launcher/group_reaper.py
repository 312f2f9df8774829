"""A watchdog process that kills the job's process groups if bpslaunch dies.

The parent-death signal (see :mod:`byteps.launcher.child_process`) kills
each direct child when bpslaunch dies, even by SIGKILL, but not the
grandchildren a worker started (a data loader, ``sleep 300 &``). The group
reaper covers them: a tiny process forked at start (C++, see
``csrc/process_control.cpp``), in its own session, holding the read end of
a pipe. bpslaunch writes each child's process group to it. If bpslaunch dies,
the kernel closes the pipe and the reaper SIGKILLs every registered group.
On a normal exit bpslaunch cleans up itself and disarms the reaper first.

Example::

    reaper = GroupReaper.start()
    reaper.register(child.pid)     # the child was started with start_new_session=True
    ...
    reaper.disarm()                # we cleaned up ourselves
"""

from __future__ import annotations

import os
import struct
from typing import Optional

from byteps.launcher import _C

__all__ = ["GroupReaper"]

_MESSAGE = struct.Struct("=i")  # native int32, as the C++ side reads it


class GroupReaper:
    """Handle on the forked reaper: register groups, then disarm or die."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid = pid
        self._fd: Optional[int] = fd

    @classmethod
    def start(cls) -> GroupReaper:
        pid, fd = _C.start_group_reaper()
        return cls(pid, fd)

    def _send(self, value: int) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, _MESSAGE.pack(value))
        except OSError:  # the reaper is gone; the parent-death signal still covers children
            self._close_fd()

    def register(self, pgid: int) -> None:
        """Kill this group if bpslaunch dies."""
        if pgid > 0:
            self._send(pgid)

    def forget(self, pgid: int) -> None:
        """Stop watching a group (it was cleaned up)."""
        if pgid > 0:
            self._send(-pgid)

    def disarm(self) -> None:
        """Tell the reaper to exit without killing anything, and wait for it."""
        self._send(0)
        self._close_fd()
        self._wait()

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _wait(self) -> None:
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:  # already reaped by the supervisor's reaping loop
            pass
