"""The job's own voice: the few lines a user sees by default.

Every process of a job logs its progress (the scheduler is up, every node
registered, a node still waits and for what) to the ``byteps.job`` logger,
apart from the diagnostic loggers under ``byteps.<package>``. The worker
and server entry points show it at INFO unless the job is asked to be quiet
(``BYTEPS_LOG_LEVEL=ERROR``, ``bpslaunch -q``); see
:func:`byteps.common.logging_setup.configure_logging`.

:class:`WaitReporter` paces the "still waiting" lines of anything that
waits for other nodes: the first after 5 s, then ever more rarely, up to
once every 30 s, so a server started minutes before its workers says what it
waits for without filling the screen.

Example::

    reporter = WaitReporter()
    while not ready():
        if reporter.due():
            job_log.warning("still waiting %.0f s for: %s", reporter.waited_s, missing())
"""

from __future__ import annotations

import logging
import time
from typing import Optional, Sequence

__all__ = ["job_log", "JOB_LOGGER", "WaitReporter", "WAIT_REPORT_INTERVALS_S"]

JOB_LOGGER = "byteps.job"
job_log = logging.getLogger(JOB_LOGGER)

#: Seconds between successive "still waiting" lines; the last one repeats.
WAIT_REPORT_INTERVALS_S: Sequence[float] = (5.0, 5.0, 10.0, 10.0, 30.0)


class WaitReporter:
    """Says when the next "still waiting" line is due."""

    def __init__(self, intervals_s: Sequence[float] = WAIT_REPORT_INTERVALS_S,
                 start: Optional[float] = None) -> None:
        self._intervals = tuple(intervals_s)
        self._start = time.monotonic() if start is None else start
        self._reported = 0
        self._next = self._start + self._intervals[0]

    @property
    def waited_s(self) -> float:
        return time.monotonic() - self._start

    def until_due(self) -> float:
        """Seconds until the next line is due (0 when it is)."""
        return max(0.0, self._next - time.monotonic())

    def due(self) -> bool:
        """True once per interval: the caller should report now."""
        now = time.monotonic()
        if now < self._next:
            return False
        self._reported += 1
        self._next = now + self._intervals[min(self._reported, len(self._intervals) - 1)]
        return True
