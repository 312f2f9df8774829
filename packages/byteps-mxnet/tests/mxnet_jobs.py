"""Run a script under the real bpslaunch and collect what every rank printed.

Every byteps-mxnet test that needs several workers goes through here, so the
launcher, scheduler, servers and workers are the real ones, on 127.0.0.1
with ports the launcher picks free; the launcher tears the job down when a
process fails or the test's timeout kills it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

__all__ = ["JOB_LAYOUTS", "run_job", "rank_lines", "assert_all_ok"]

#: The two layouts every multi-worker script must work under.
JOB_LAYOUTS = {
    "one-machine-np2": ["-np", "2"],
    "two-machines-two-servers": ["--workers", "2", "--servers", "2"],
}


def _clean_env(extra: Optional[Dict[str, str]]) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_", "PS_", "MXNET_"))}
    env.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    env.update(extra or {})
    return env


def run_job(layout: Sequence[str], script: str, args: Sequence[str] = (), env: Optional[Dict[str, str]] = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    """``bpslaunch <layout> -- python <script> <args>``."""
    command = [sys.executable, "-m", "byteps.launcher", "--grace-period", "2", *layout, "--",
               sys.executable, script, *args]
    return subprocess.run(command, env=_clean_env(env), capture_output=True, text=True, timeout=timeout)


def rank_lines(output: str, rank: int) -> List[str]:
    """Lines printed by one worker rank (bpslaunch prefixes them with ``[worker N] ``)."""
    prefix = f"[worker {rank}] "
    return [line[len(prefix):] for line in output.splitlines() if line.startswith(prefix)]


def assert_all_ok(result: subprocess.CompletedProcess, checks: int, ranks: int = 2) -> None:
    """The job exited 0 and every rank printed ``ALL OK <checks>``; else show what they printed."""
    report = f"exit {result.returncode}\n--- stdout\n{result.stdout[-6000:]}\n--- stderr\n{result.stderr[-4000:]}"
    assert result.returncode == 0, report
    for rank in range(ranks):
        assert f"ALL OK {checks}" in rank_lines(result.stdout, rank), report
