"""Everything a job started, with the means to reap it and kill all of it.

Three layers make sure no process of a job survives it:

* each child leads its own process group, so one ``killpg`` reaches the
  child and whatever it started in the background;
* bpslaunch becomes a *child subreaper* (``PR_SET_CHILD_SUBREAPER``):
  descendants orphaned while the job runs (a daemon that left its group with
  ``setsid``) are re-parented to bpslaunch instead of init, so they can be
  found (``/proc/*/stat``), killed and reaped. It also means zombies get
  reaped even where pid 1 does not reap;
* the :class:`~byteps.launcher.group_reaper.GroupReaper` kills every group if
  bpslaunch itself is killed.

The subreaper part reaps *any* child of this process it does not track, so
it belongs to a process that owns all its children, like bpslaunch; a
library user inside a larger program passes ``adopt_orphans=False``.

Example::

    tree = ProcessTree(adopt_orphans=True)
    tree.start()
    tree.add(ChildProcess.spawn(spec))
    exited = tree.reap()            # children that ended since the last call
    tree.signal_all(signal.SIGTERM)
    tree.close()
"""

from __future__ import annotations

import os
from typing import Dict, List, Set

from byteps.launcher import _C
from byteps.launcher.child_process import ChildProcess
from byteps.launcher.group_reaper import GroupReaper

__all__ = ["ProcessTree"]


def _children_of(parent: int) -> List[int]:
    """Pids whose parent is ``parent``, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if len(fields) > 1 and int(fields[1]) == parent:
            found.append(int(entry))
    return found


def _kill(target: int, sig: int, group: bool) -> bool:
    """Signal a pid or a process group; False when nothing is there."""
    try:
        if group:
            os.killpg(target, sig)
        else:
            os.kill(target, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process reused the id: leave it alone
        return False


class ProcessTree:
    """The children of one job, their process groups and adopted orphans."""

    def __init__(self, *, adopt_orphans: bool = True, use_group_reaper: bool = True) -> None:
        self._adopt = adopt_orphans
        self._use_reaper = use_group_reaper
        self._reaper = None
        self._was_subreaper = False
        self.children: Dict[int, ChildProcess] = {}
        self._signalled_orphans: Set[int] = set()

    def start(self) -> None:
        if self._adopt:
            self._was_subreaper = _C.is_child_subreaper()
            _C.set_child_subreaper(True)
        if self._use_reaper:
            self._reaper = GroupReaper.start()

    def add(self, child: ChildProcess) -> None:
        self.children[child.pid] = child
        if self._reaper is not None:
            self._reaper.register(child.pgid)

    def running(self) -> List[ChildProcess]:
        return [c for c in self.children.values() if c.running]

    def reap(self) -> List[ChildProcess]:
        """Collect exited children; returns the tracked ones that ended just now."""
        exited = [c for c in self.children.values() if c.running and c.poll() is not None]
        if not self._adopt:
            return exited
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                break
            if info is None or info.si_pid == 0:
                break
            child = self.children.get(info.si_pid)
            if child is None:
                try:
                    os.waitpid(info.si_pid, 0)  # an adopted orphan (or the reaper): just reap it
                except ChildProcessError:
                    pass
            elif child.running and child.poll() is not None:
                exited.append(child)
            elif not child.running:
                break  # should not happen; never spin on it
        return exited

    def orphans(self) -> List[int]:
        """Adopted descendants still alive (only with adopt_orphans)."""
        if not self._adopt:
            return []
        skip = set(self.children)
        if self._reaper is not None:
            skip.add(self._reaper.pid)
        return [pid for pid in _children_of(os.getpid()) if pid not in skip]

    def live_groups(self) -> List[ChildProcess]:
        """Children whose process group still has members (the child or what it started)."""
        return [c for c in self.children.values() if _kill(c.pgid, 0, group=True)]

    def signal(self, child: ChildProcess, sig: int) -> None:
        """Send ``sig`` to one child's process group (nothing if it is gone)."""
        _kill(child.pgid, sig, group=True)

    def signal_all(self, sig: int) -> None:
        """Send ``sig`` to every process group of the job and every adopted orphan."""
        for child in self.children.values():
            _kill(child.pgid, sig, group=True)
        for pid in self.orphans():
            _kill(pid, sig, group=False)
            self._signalled_orphans.add(pid)

    def signal_new_orphans(self, sig: int) -> None:
        """Send ``sig`` to orphans adopted since the last signal_all (e.g. during a grace period)."""
        for pid in self.orphans():
            if pid not in self._signalled_orphans:
                _kill(pid, sig, group=False)
                self._signalled_orphans.add(pid)

    def is_empty(self) -> bool:
        """No child running, no group with members, no adopted orphan."""
        self.reap()
        return not self.running() and not self.live_groups() and not self.orphans()

    def close(self) -> None:
        """Disarm the group reaper and give up the subreaper role."""
        if self._reaper is not None:
            self._reaper.disarm()
            self._reaper = None
        if self._adopt and not self._was_subreaper:
            _C.set_child_subreaper(False)
        self.reap()

