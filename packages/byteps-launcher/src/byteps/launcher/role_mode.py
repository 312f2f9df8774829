"""Role mode: BytePS's original contract, one bpslaunch per machine and role.

Used when ``DMLC_ROLE`` is set. Every other ``DMLC_*``/``BYTEPS_*`` variable
comes from the environment, read and checked through
:class:`byteps.common.config.Config`:

* ``worker``: ``BYTEPS_LOCAL_SIZE`` (default 1) local processes run COMMAND,
  each with its ``BYTEPS_LOCAL_RANK``;
* ``server`` / ``scheduler``: one process runs ``python -m byteps.server``;
  COMMAND is ignored, as in BytePS. The scheduler gets
  ``BYTEPS_SHUTDOWN_LEAVES_JOB=1`` (unless set): a worker's ``shutdown()``
  leaves the job, so scheduler and servers exit 0 once every worker has
  shut down, as BytePS's do.

Example::

    env = {"DMLC_ROLE": "worker", "BYTEPS_LOCAL_SIZE": "2", **os.environ}
    plan = role_plan(["python", "train.py"], env)   # two worker processes
"""

from __future__ import annotations

from typing import Mapping, Sequence

from byteps.common.config import Config
from byteps.launcher.job_plan import (
    SERVER_ARGV,
    JobPlan,
    ProcessSpec,
    UsageError,
    child_environment,
    worker_variables,
)

__all__ = ["role_plan"]


def role_plan(command: Sequence[str], environ: Mapping[str, str]) -> JobPlan:
    """Plan this machine's share of a job; raises ConfigError or UsageError."""
    config = Config.from_env(environ)
    if config.role != "worker":
        # BytePS's contract: a worker's shutdown() leaves the job, which ends when every worker has left
        # (BytePS's own tests join the scheduler before their worker process exits).
        given = environ.get("BYTEPS_SHUTDOWN_LEAVES_JOB", "").strip()
        leaves = {"BYTEPS_SHUTDOWN_LEAVES_JOB": "1"} if config.role == "scheduler" and not given else {}
        env = child_environment(environ, leaves)
        process = ProcessSpec(config.role, SERVER_ARGV, env)
        plan = JobPlan(mode="role", distributed=True, processes=(process,))
        plan.validate()
        return plan

    if not command:
        raise UsageError("missing COMMAND: DMLC_ROLE=worker needs the training command to run")
    size = config.local_size
    processes = []
    for local_rank in range(size):
        env = child_environment(
            environ, worker_variables(config.worker_id, config.num_worker, local_rank, size)
        )
        rank = config.worker_id * size + local_rank
        processes.append(ProcessSpec("worker", tuple(command), env, rank=rank, local_rank=local_rank))
    plan = JobPlan(mode="role", distributed=config.is_distributed, processes=tuple(processes))
    plan.validate()
    return plan
