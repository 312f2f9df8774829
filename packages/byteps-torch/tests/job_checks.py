"""Run a training script once per layout and ask which of its checks passed on which rank.

The scripts under ``scripts/`` print ``OK <check>`` per check and
rank (see ``scripts/check_runner.py``). Starting a job costs a few
seconds (every worker imports torch), so each script runs once per layout
per test session, and the tests read its output.
"""

from __future__ import annotations

import os
import subprocess
from typing import Dict, List, Tuple

from byteps.testkit import JOB_LAYOUTS, launch_job, rank_lines, tail

__all__ = ["ScriptJobs", "LAYOUTS"]

#: JOB_LAYOUTS plus one worker process alone (bpslaunch with no servers).
LAYOUTS = {**JOB_LAYOUTS, "single-worker": []}

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")


class ScriptJobs:
    """Runs ``script`` lazily under each layout asked for, once."""

    def __init__(self, script: str, tmp_root: str, timeout: float = 120) -> None:
        self.script = os.path.join(SCRIPTS, script)
        self.tmp_root = tmp_root
        self.timeout = timeout
        self._results: Dict[str, subprocess.CompletedProcess] = {}

    def result(self, layout: str) -> subprocess.CompletedProcess:
        if layout not in self._results:
            tmp = os.path.join(self.tmp_root, layout)
            os.makedirs(tmp, exist_ok=True)
            self._results[layout] = launch_job(LAYOUTS[layout], self.script, env={"BYTEPS_TEST_TMP": tmp},
                                               timeout=self.timeout)
        return self._results[layout]

    def ranks(self, layout: str) -> List[int]:
        return [0] if not LAYOUTS[layout] else [0, 1]

    def assert_passed(self, layout: str, check: str) -> Tuple[List[str], ...]:
        """Every rank printed ``OK <check>``; returns each rank's lines."""
        result = self.result(layout)
        lines = tuple(rank_lines(result.stdout, rank) for rank in self.ranks(layout))
        for rank, printed in enumerate(lines):
            assert f"OK {check}" in printed, (
                f"rank {rank} did not pass {check!r} (exit {result.returncode}):\n"
                f"{tail(result.stdout)}\n--- stderr ---\n{tail(result.stderr)}")
        return lines

