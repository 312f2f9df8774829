"""Logging of byteps processes, set from BYTEPS_LOG_LEVEL and PS_VERBOSE.

BYTEPS_LOG_LEVEL sets the ``byteps`` loggers (TRACE is finer than DEBUG);
PS_VERBOSE (0, 1, 2) sets the transport's, as it set ps-lite's. The job log
(``byteps.job``: the scheduler is up, all nodes registered, who waits for
what) is shown at INFO by default, as short ``byteps: ...`` lines, and
silenced with BYTEPS_LOG_LEVEL=ERROR or FATAL (``bpslaunch -q``).
"""

from __future__ import annotations

import logging
import sys

from byteps.common.config import Config
from byteps.transport.job_log import JOB_LOGGER

__all__ = ["configure_logging", "TRACE"]

TRACE = 5
_TRANSPORT_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG}


def configure_logging(config: Config, who: str) -> None:
    """Route byteps logs to stderr, each line tagged with ``who`` (e.g. 'worker 1')."""
    logging.addLevelName(TRACE, "TRACE")
    level = TRACE if config.log_level == "TRACE" else getattr(logging, config.log_level.replace("FATAL", "CRITICAL"))
    root = logging.getLogger("byteps")
    if not any(getattr(h, "_byteps", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"[%(asctime)s {who}] %(levelname)s %(name)s: %(message)s"))
        handler._byteps = True  # type: ignore[attr-defined]
        root.addHandler(handler)
        root.propagate = False
    root.setLevel(level)
    transport_level = min(level, _TRANSPORT_LEVELS[config.ps_verbose])
    logging.getLogger("byteps.transport").setLevel(transport_level)
    job = logging.getLogger(JOB_LOGGER)
    if not any(getattr(h, "_byteps", False) for h in job.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("byteps: %(message)s"))
        handler._byteps = True  # type: ignore[attr-defined]
        job.addHandler(handler)
        job.propagate = False
    job.setLevel(min(level, logging.INFO) if level <= logging.WARNING else level)
