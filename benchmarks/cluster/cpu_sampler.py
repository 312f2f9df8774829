"""CPU use while a measurement runs: the whole machine's, and the job's own processes'.

The simulated hosts share the machine's cores, so a cluster of 2n+1 hosts
can run out of CPU before it runs out of bandwidth. A sampler thread reads
/proc/stat (all cores) and /proc/<pid>/stat of every process of the job
four times a second; :meth:`CpuSampler.window` then says, for the timed
rounds only, how busy the machine was and how many cores the job itself
used. Busy cores that the job did not use belong to someone else.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Dict, List, Optional, Tuple

__all__ = ["CpuSampler"]

_TICK = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1


def _machine() -> Tuple[int, int]:
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    return sum(fields), fields[3] + fields[4]  # all ticks, idle + iowait


def _process_ticks(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])  # utime + stime, all threads


class CpuSampler:
    """Samples machine and per-process CPU ticks until stopped."""

    def __init__(self, period_s: float = 0.25) -> None:
        self.period_s = period_s
        self.pids: List[int] = []
        self.samples: List[Tuple[float, int, int, Dict[int, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            total, idle = _machine()
            ticks = {pid: t for pid in list(self.pids) if (t := _process_ticks(pid)) is not None}
            self.samples.append((time.time(), total, idle, ticks))
            if self._stop.wait(self.period_s):
                return

    def window(self, begin: float, end: float) -> Dict[str, float]:
        """machine_busy (0..1 of all cores) and job_cores (cores the job's processes used) in [begin, end]."""
        inside = [s for s in self.samples if begin - self.period_s <= s[0] <= end + self.period_s]
        if len(inside) < 2:
            return {"machine_busy": float("nan"), "job_cores": float("nan")}
        first, last = inside[0], inside[-1]
        total, idle = last[1] - first[1], last[2] - first[2]
        job = sum(last[3].get(pid, first[3].get(pid, 0)) - first[3].get(pid, 0) for pid in last[3])
        seconds = last[0] - first[0]
        return {"machine_busy": 1 - idle / total if total else float("nan"),
                "job_cores": job / _TICK / seconds if seconds > 0 else float("nan")}
