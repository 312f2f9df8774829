"""Linux process control for bpslaunch (csrc/process_control.cpp)."""

def set_parent_death_signal(signal: int, expected_parent: int) -> None:
    """prctl(PR_SET_PDEATHSIG) in a freshly forked child (Popen's preexec_fn).

    If the parent is no longer ``expected_parent`` (it died before the prctl),
    the child ``_exit``\\ s at once with status 128 + signal.
    """

def get_parent_death_signal() -> int:
    """The calling process's parent-death signal, 0 when none."""

def set_child_subreaper(enabled: bool = True) -> None:
    """prctl(PR_SET_CHILD_SUBREAPER): orphaned descendants get re-parented to us."""

def is_child_subreaper() -> bool:
    """Whether the calling process is a child subreaper."""

def set_cpu_affinity(pid: int, cpus: list[int]) -> None:
    """sched_setaffinity on ``pid`` (0 = the caller); OSError names pid and CPUs."""

def get_cpu_affinity(pid: int) -> list[int]:
    """sched_getaffinity on ``pid`` (0 = the caller): sorted logical CPU ids."""

def start_group_reaper() -> tuple[int, int]:
    """Fork the group-reaper watchdog; returns ``(pid, write_fd)``.

    Write native int32 messages to ``write_fd``: a pgid > 0 registers a
    process group, ``-pgid`` forgets it, 0 disarms (the reaper exits without
    killing). When the pipe closes without a disarm (bpslaunch died), the
    reaper SIGKILLs every registered group and exits.
    """
