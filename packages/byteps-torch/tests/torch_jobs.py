"""Run a script under the real bpslaunch and collect what every rank printed.

Every byteps-torch test that needs several workers goes through here, so
the launcher, scheduler, servers and workers are the real ones. Scripts get
``BYTEPS_TEST_TMP`` (a per-test folder) for any files they exchange with the
test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Dict, Optional, Sequence

__all__ = ["run_job", "JOB_LAYOUTS"]

#: The two layouts every multi-worker script must work under (issue: same script, both).
JOB_LAYOUTS = {
    "one-machine-np2": ["-np", "2"],
    "two-machines-two-servers": ["--workers", "2", "--servers", "2"],
}


def _clean_env(extra: Optional[Dict[str, str]]) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_", "PS_"))}
    env.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    env.update(extra or {})
    return env


def run_job(layout: Sequence[str], script: str, args: Sequence[str] = (), env: Optional[Dict[str, str]] = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    """``bpslaunch <layout> -- python <script> <args>``; the launcher tears the job down on failure."""
    command = [sys.executable, "-m", "byteps.launcher", "--grace-period", "2", *layout, "--",
               sys.executable, script, *args]
    return subprocess.run(command, env=_clean_env(env), capture_output=True, text=True, timeout=timeout)


def rank_lines(output: str, rank: int) -> list:
    """Lines printed by one worker rank (bpslaunch prefixes them with ``[worker N] ``)."""
    prefix = f"[worker {rank}] "
    return [line[len(prefix):] for line in output.splitlines() if line.startswith(prefix)]
