"""byteps-tf's settings for the processes its tests start: TensorFlow quiet, one thread per op.

Everything else (bpslaunch, layouts, reading each rank's lines) is
byteps.testkit's.
"""

from __future__ import annotations

import os
import subprocess
from typing import Mapping, Optional, Sequence

from byteps.testkit import launch_job

__all__ = ["TF_SETTINGS", "SCRIPTS", "launch_tf_job"]

#: The environment TensorFlow runs with in every process a test starts.
TF_SETTINGS = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
               "TF_NUM_INTRAOP_THREADS": "1", "KERAS_BACKEND": "tensorflow"}

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")


def launch_tf_job(layout: Sequence[str], script: str, args: Sequence[str] = (),
                  env: Optional[Mapping[str, str]] = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """:func:`byteps.testkit.launch_job` with :data:`TF_SETTINGS` (TensorFlow's import makes jobs slower: 180 s)."""
    return launch_job(layout, script, args, {**TF_SETTINGS, **(env or {})}, timeout)
