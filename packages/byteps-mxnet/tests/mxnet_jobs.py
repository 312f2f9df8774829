"""byteps-mxnet's one difference in running a job: the caller's ``MXNET_*`` settings stay out of it.

Everything else (bpslaunch, layouts, reading each rank's lines) is
byteps.testkit's; a test that wants an MXNet setting passes it in ``env``.
"""

from __future__ import annotations

import subprocess
from typing import Mapping, Optional, Sequence

from byteps.testkit import launch_job

__all__ = ["launch_mxnet_job"]


def launch_mxnet_job(layout: Sequence[str], script: str, args: Sequence[str] = (),
                     env: Optional[Mapping[str, str]] = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """:func:`byteps.testkit.launch_job` without any ``MXNET_*`` variable of this environment."""
    return launch_job(layout, script, args, env, timeout, drop=("MXNET_",))
