"""CPU pinning: BytePS's ``BYTEPS_VISIBLE_CPU_CORES`` syntax and the syscalls.

BytePS pins each local worker process to the cores near its GPU. This module
provides the mechanism only (parsing the core list, setting and reading a
process's affinity); deciding which cores a local rank gets is a later step.

Syntax: sections separated by ``:`` (one per local rank), each a
comma-separated list of core ids and inclusive ranges::

    >>> parse_visible_cpu_cores("1,4-5,7-11:20-25")
    [[1, 4, 5, 7, 8, 9, 10, 11], [20, 21, 22, 23, 24, 25]]
    >>> set_cpu_affinity(0, [0])        # pin the calling process to CPU 0
    >>> get_cpu_affinity(0)
    [0]
"""

from __future__ import annotations

from typing import List, Sequence

from byteps.common import config
from byteps.launcher import _C

__all__ = ["parse_visible_cpu_cores", "parse_cpu_list", "set_cpu_affinity", "get_cpu_affinity"]

_VARIABLE = "BYTEPS_VISIBLE_CPU_CORES"


def parse_cpu_list(text: str) -> List[int]:
    """Parse one section, e.g. ``"1,4-5,7-11"``, into sorted unique core ids (ValueError names the variable)."""
    cores = config.parse_cpu_list(_VARIABLE, text)
    if not cores:
        raise ValueError(f"{_VARIABLE}: empty core list {text!r}")
    return list(cores)


def parse_visible_cpu_cores(text: str) -> List[List[int]]:
    """Parse ``"1,4-5:20-25"`` into one sorted core list per local rank (the parser Config uses)."""
    if not text.strip():
        raise ValueError(f"{_VARIABLE}: empty value")
    return [list(section) for section in config.parse_cpu_sections(_VARIABLE, text)]


def set_cpu_affinity(pid: int, cpus: Sequence[int]) -> None:
    """Restrict ``pid`` (0 = this process) to ``cpus``; OSError names pid and CPUs."""
    _C.set_cpu_affinity(int(pid), [int(cpu) for cpu in cpus])


def get_cpu_affinity(pid: int) -> List[int]:
    """The sorted logical CPUs ``pid`` (0 = this process) may run on."""
    return _C.get_cpu_affinity(int(pid))
