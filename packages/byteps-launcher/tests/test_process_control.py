"""The C++ extension byteps.launcher._C, on this machine's real CPUs and processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from launcher_harness import PY

from byteps.launcher import _C
from byteps.launcher.group_reaper import GroupReaper
from byteps.testkit import is_alive, kill_group, wait_until_dead

# ------------------------------------------------------------------ affinity


def test_affinity_round_trip_on_this_process():
    original = _C.get_cpu_affinity(0)
    assert original == sorted(os.sched_getaffinity(0))
    try:
        _C.set_cpu_affinity(0, [original[-1]])
        assert _C.get_cpu_affinity(0) == [original[-1]]
        assert os.sched_getaffinity(0) == {original[-1]}
    finally:
        _C.set_cpu_affinity(0, original)
    assert _C.get_cpu_affinity(0) == original


def test_affinity_of_another_process():
    cpus = _C.get_cpu_affinity(0)
    child = subprocess.Popen(["sleep", "30"])
    try:
        _C.set_cpu_affinity(child.pid, cpus[:1])
        assert _C.get_cpu_affinity(child.pid) == cpus[:1]
    finally:
        child.kill()
        child.wait()


def test_affinity_errors_are_clear():
    with pytest.raises(ValueError, match="empty"):
        _C.set_cpu_affinity(0, [])
    with pytest.raises(ValueError, match=">= 0"):
        _C.set_cpu_affinity(0, [-1])
    with pytest.raises(OSError, match="not online|Invalid argument") as info:
        _C.set_cpu_affinity(0, [100_000])
    assert "100000" in str(info.value)
    dead = subprocess.Popen(["true"])
    dead.wait()
    with pytest.raises(ProcessLookupError, match=f"pid={dead.pid}"):
        _C.get_cpu_affinity(dead.pid)
    with pytest.raises(ProcessLookupError, match=f"pid={dead.pid}"):
        _C.set_cpu_affinity(dead.pid, [0])


# ------------------------------------------------------- parent-death signal

_MIDDLE = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from byteps.launcher import _C
    parent = os.getpid()
    child = subprocess.Popen(
        ["sleep", "60"],
        preexec_fn=lambda: _C.set_parent_death_signal(int(sys.argv[1]), parent),
    )
    print(child.pid, flush=True)
    time.sleep(60)
    """
)


@pytest.mark.parametrize("death_signal", [signal.SIGKILL, signal.SIGTERM])
def test_child_dies_with_its_parent(death_signal):
    middle = subprocess.Popen([PY, "-c", _MIDDLE, str(int(death_signal))], stdout=subprocess.PIPE)
    try:
        grandchild = int(middle.stdout.readline())
        assert is_alive(grandchild)
        middle.kill()  # SIGKILL: no chance for any cleanup code in the parent
        middle.wait()
        assert wait_until_dead([grandchild], timeout=5) == []
    finally:
        middle.kill()
        middle.wait()
        middle.stdout.close()
        if is_alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_death_signal_is_set_and_readable():
    code = (
        "from byteps.launcher import _C; import os\n"
        "assert _C.get_parent_death_signal() == 0\n"
        "_C.set_parent_death_signal(15, os.getppid())\n"
        "print(_C.get_parent_death_signal())"
    )
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "15"


def test_parent_already_gone_exits_at_once():
    # expected_parent is not our parent: the race "parent died before prctl" path.
    code = "from byteps.launcher import _C; _C.set_parent_death_signal(9, 1); print('survived')"
    result = subprocess.run([PY, "-c", code], capture_output=True, text=True)
    assert result.returncode == 128 + 9
    assert "survived" not in result.stdout


def test_bad_signal_number():
    with pytest.raises(ValueError, match="signal"):
        _C.set_parent_death_signal(0, os.getppid())


def test_child_subreaper_flag():
    code = (
        "from byteps.launcher import _C\n"
        "print(_C.is_child_subreaper()); _C.set_child_subreaper(True); print(_C.is_child_subreaper())"
    )
    out = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]


# -------------------------------------------------------------- group reaper


def _session(command):
    return subprocess.Popen(command, start_new_session=True)


def test_group_reaper_kills_registered_groups_when_its_pipe_closes():
    leader = subprocess.Popen(
        ["sh", "-c", "sleep 300 & echo $!; exec sleep 300"], start_new_session=True, stdout=subprocess.PIPE
    )
    background = int(leader.stdout.readline())
    leader.stdout.close()
    unregistered = _session(["sleep", "300"])
    reaper = GroupReaper.start()
    try:
        reaper.register(leader.pid)
        reaper.register(unregistered.pid)
        reaper.forget(unregistered.pid)
        reaper._close_fd()  # what the kernel does when bpslaunch dies
        reaper._wait()
        assert leader.wait(timeout=5) == -signal.SIGKILL
        assert wait_until_dead([background], timeout=5) == []  # the group went with it
        assert unregistered.poll() is None
    finally:
        for proc in (leader, unregistered):
            kill_group(proc.pid)
            proc.wait()


def test_disarmed_group_reaper_kills_nothing():
    leader = _session(["sleep", "300"])
    reaper = GroupReaper.start()
    try:
        reaper.register(leader.pid)
        reaper.disarm()
        assert not is_alive(reaper.pid)
        assert leader.poll() is None
    finally:
        leader.kill()
        leader.wait()


def test_group_reaper_is_in_its_own_session():
    reaper = GroupReaper.start()
    try:
        assert os.getsid(reaper.pid) == reaper.pid
        assert sys.platform.startswith("linux")
        with open(f"/proc/{reaper.pid}/comm") as comm:
            assert comm.read().strip() == "bpslaunch-reap"
    finally:
        reaper.disarm()
