"""Embedded mode: the whole job on this machine, over 127.0.0.1.

Used when ``DMLC_ROLE`` is unset. ``bpslaunch -np L --workers W --servers K
COMMAND`` plans one scheduler, K servers and W "machines" of L local worker
processes each, with a free port for the scheduler. Defaults follow BytePS:
one worker needs neither scheduler nor servers; several workers get one
server each. Several local processes on one machine sum in shared memory
(local aggregation) and need the scheduler but no server;
``--force-distributed`` adds one.

Example::

    plan = embedded_plan(EmbeddedOptions(num_worker=2), ["python", "train.py"], os.environ)
    [p.label for p in plan.processes]
    # ['scheduler', 'server 0', 'server 1', 'worker 0 (local rank 0)', 'worker 1 (local rank 0)']
"""

from __future__ import annotations

import dataclasses
from typing import List, Mapping, Optional, Sequence, Tuple

from byteps.common.config import Config
from byteps.launcher.job_plan import (
    HOROVOD_VARIABLES,
    SERVER_ARGV,
    JobPlan,
    ProcessSpec,
    UsageError,
    child_environment,
    job_identity,
    worker_variables,
)
from byteps.launcher.ports import free_port

__all__ = ["EmbeddedOptions", "embedded_plan", "OWNED_VARIABLES", "LOCALHOST"]

LOCALHOST = "127.0.0.1"

#: Variables embedded mode sets itself; values inherited from the
#: environment would contradict the job it builds, so they are dropped.
OWNED_VARIABLES = (
    "DMLC_ROLE",
    "DMLC_WORKER_ID",
    "DMLC_NUM_WORKER",
    "DMLC_NUM_SERVER",
    "DMLC_PS_ROOT_URI",
    "DMLC_PS_ROOT_PORT",
    "DMLC_INTERFACE",
    "DMLC_NODE_HOST",
    "BYTEPS_LOCAL_RANK",
    "BYTEPS_LOCAL_SIZE",
    *HOROVOD_VARIABLES,
)


@dataclasses.dataclass(frozen=True)
class EmbeddedOptions:
    """The embedded-mode command line: sizes of the job and whether to force distribution."""

    local_size: int = 1  # -np: worker processes per worker machine
    num_worker: int = 1  # --workers: worker machines
    num_server: Optional[int] = None  # --servers; None: the default below
    force_distributed: bool = False  # --force-distributed (or BYTEPS_FORCE_DISTRIBUTED=1)

    def distributed(self) -> bool:
        return self.force_distributed or self.num_worker * self.local_size > 1

    def servers(self) -> int:
        """K: as given, else W servers for W > 1 workers, one for a forced job.

        One worker machine with several processes sums in shared memory
        (local aggregation) and needs no server.
        """
        if self.num_server is not None:
            return self.num_server
        if self.num_worker > 1:
            return self.num_worker
        return 1 if self.force_distributed else 0

    def check(self) -> None:
        """Raise UsageError for sizes no job can have."""
        if self.local_size < 1:
            raise UsageError(f"-np must be >= 1, got {self.local_size}")
        if self.num_worker < 1:
            raise UsageError(f"--workers must be >= 1, got {self.num_worker}")
        if self.num_server is not None and self.num_server < 0:
            raise UsageError(f"--servers must be >= 0, got {self.num_server}")
        if (self.force_distributed or self.num_worker > 1) and self.servers() < 1:
            raise UsageError("a job with several worker machines (or --force-distributed) needs --servers >= 1")
        if not self.distributed() and self.servers() > 0:
            raise UsageError(
                "--servers needs a distributed job (--workers > 1, -np > 1 or --force-distributed); "
                "a single worker process runs without scheduler and servers"
            )


def stale_variables(environ: Mapping[str, str]) -> List[str]:
    """Owned variables present in ``environ``: embedded mode overrides them (worth a warning)."""
    return [name for name in OWNED_VARIABLES if environ.get(name, "").strip()]


def embedded_plan(
    options: EmbeddedOptions,
    command: Sequence[str],
    environ: Mapping[str, str],
    port: Optional[int] = None,
) -> JobPlan:
    """Plan an embedded job; raises UsageError or ConfigError (naming the variable).

    ``BYTEPS_FORCE_DISTRIBUTED=1`` in ``environ`` forces distribution like
    ``--force-distributed``. ``port`` is the scheduler's; a free one when None.
    """
    if not command:
        raise UsageError("missing COMMAND: what should each worker process run?")
    base_env = {k: v for k, v in environ.items() if k not in OWNED_VARIABLES}
    # Judge the user's own knobs (BYTEPS_FORCE_DISTRIBUTED, BYTEPS_LOG_LEVEL,
    # ...) against a stand-in topology: the real one is ours to build.
    # (A scheduler's: the checks that depend on the job's size run in plan.validate(), on each child's.)
    stand_in = {"DMLC_PS_ROOT_URI": LOCALHOST, "DMLC_PS_ROOT_PORT": "1", "DMLC_NUM_SERVER": "1",
                "DMLC_ROLE": "scheduler"}
    inherited = Config.from_env({**base_env, **stand_in})
    if inherited.force_distributed and not options.force_distributed:
        options = dataclasses.replace(options, force_distributed=True)
    options.check()

    if not options.distributed():
        env = child_environment(
            base_env,
            {
                "DMLC_ROLE": "worker",
                "DMLC_NUM_WORKER": "1",
                "DMLC_NUM_SERVER": "0",
                **worker_variables(0, 1, 0, 1),
            },
        )
        worker = ProcessSpec("worker", tuple(command), env, rank=0, local_rank=0)
        plan = JobPlan(mode="embedded", distributed=False, processes=(worker,))
        plan.validate()
        return plan

    shared = {
        "DMLC_PS_ROOT_URI": LOCALHOST,
        "DMLC_PS_ROOT_PORT": str(port if port is not None else free_port(LOCALHOST)),
        "DMLC_NUM_WORKER": str(options.num_worker),
        "DMLC_NUM_SERVER": str(options.servers()),
        "DMLC_INTERFACE": "lo",
        "DMLC_NODE_HOST": LOCALHOST,
    }
    if options.force_distributed:
        shared["BYTEPS_FORCE_DISTRIBUTED"] = "1"
    shared.update(job_identity(base_env))

    def spec(role: str, argv: Tuple[str, ...], extra: Mapping[str, str], **rank) -> ProcessSpec:
        env = child_environment(base_env, {**shared, "DMLC_ROLE": role, **extra})
        return ProcessSpec(role, argv, env, **rank)

    processes = [spec("scheduler", SERVER_ARGV, {})]
    processes += [spec("server", SERVER_ARGV, {}, rank=i) for i in range(options.servers())]
    size = options.local_size
    for worker_id in range(options.num_worker):
        for local_rank in range(size):
            extra = worker_variables(worker_id, options.num_worker, local_rank, size)
            rank = worker_id * size + local_rank
            processes.append(spec("worker", tuple(command), extra, rank=rank, local_rank=local_rank))
    plan = JobPlan(mode="embedded", distributed=True, processes=tuple(processes))
    plan.validate()
    return plan
