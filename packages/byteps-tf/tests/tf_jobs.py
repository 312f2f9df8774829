"""Run a script under the real bpslaunch and collect what every rank printed.

Every byteps-tf test that needs several workers goes through here, so the
launcher, scheduler, servers and workers are the real ones. Scripts get
``BYTEPS_TEST_TMP`` (a per-test folder) for files they exchange with the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

__all__ = ["run_job", "rank_lines", "JOB_LAYOUTS", "SCRIPTS"]

#: The two layouts multi-worker scripts run under: one machine, and two workers with two servers.
JOB_LAYOUTS = {
    "one-machine-np2": ["-np", "2"],
    "two-machines-two-servers": ["--workers", "2", "--servers", "2"],
}

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")


def clean_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """This environment without byteps' variables, with TensorFlow kept quiet and single-threaded per op."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_", "PS_"))}
    env.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
                "TF_NUM_INTRAOP_THREADS": "1", "KERAS_BACKEND": "tensorflow"})
    env.update(extra or {})
    return env


def run_job(layout: Sequence[str], script: str, args: Sequence[str] = (), env: Optional[Dict[str, str]] = None,
            timeout: float = 180) -> subprocess.CompletedProcess:
    """``bpslaunch <layout> -- python <script> <args>``; the launcher tears the job down on failure."""
    command = [sys.executable, "-m", "byteps.launcher", "--grace-period", "2", *layout, "--",
               sys.executable, script, *args]
    return subprocess.run(command, env=clean_env(env), capture_output=True, text=True, timeout=timeout)


def rank_lines(output: str, rank: int) -> List[str]:
    """Lines printed by one worker rank (bpslaunch prefixes them with ``[worker N] ``)."""
    prefix = f"[worker {rank}] "
    return [line[len(prefix):] for line in output.splitlines() if line.startswith(prefix)]


def report(result: subprocess.CompletedProcess) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout[-8000:]}\n--- stderr\n{result.stderr[-4000:]}"


def assert_all_ok(result: subprocess.CompletedProcess, checks: int, ranks: int = 2) -> None:
    """The job exited 0 and every rank printed ``ALL OK <checks>``."""
    assert result.returncode == 0, report(result)
    for rank in range(ranks):
        assert f"ALL OK {checks}" in rank_lines(result.stdout, rank), report(result)
