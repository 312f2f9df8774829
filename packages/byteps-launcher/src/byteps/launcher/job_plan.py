"""What a job runs: one :class:`ProcessSpec` per child, gathered in a :class:`JobPlan`.

A plan is pure data, built from the command line and the environment by
:mod:`byteps.launcher.embedded_mode` or :mod:`byteps.launcher.role_mode`, and
executed by :class:`byteps.launcher.supervisor.Supervisor`. Keeping the two
apart lets tests check the exact environment each child will get without
starting anything.

Example::

    plan = JobPlan(mode="role", distributed=False, processes=(
        ProcessSpec(role="worker", argv=("python", "train.py"), env=env, rank=0, local_rank=0),
    ))
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Iterable, Mapping, Optional, Tuple

from byteps.common.config import Config

__all__ = ["ProcessSpec", "JobPlan", "UsageError", "SERVER_ARGV", "child_environment", "horovod_variables",
           "HOROVOD_VARIABLES"]

#: Scheduler and servers both run the byteps server entry point; ps-lite
#: style, the role comes from DMLC_ROLE.
SERVER_ARGV: Tuple[str, ...] = (sys.executable, "-m", "byteps.server")


class UsageError(ValueError):
    """The command line cannot describe a job (bpslaunch exits 2)."""


@dataclasses.dataclass(frozen=True)
class ProcessSpec:
    """One child process: its role, rank, command line and full environment.

    ``rank`` is the server index for a server (None when unknown, as in role
    mode, where the scheduler assigns it) and the global worker rank
    (``worker_id * local_size + local_rank``) for a worker. ``cpus``: the
    logical CPUs the child is pinned to before it starts (None: not pinned;
    set by :func:`byteps.launcher.cpu_placement.place_workers`).
    """

    role: str
    argv: Tuple[str, ...]
    env: Mapping[str, str]
    rank: Optional[int] = None
    local_rank: Optional[int] = None
    cpus: Optional[Tuple[int, ...]] = None

    @property
    def is_worker(self) -> bool:
        return self.role == "worker"

    @property
    def short_name(self) -> str:
        """``scheduler``, ``server 0``, ``worker 3``: used as the output prefix."""
        return self.role if self.rank is None else f"{self.role} {self.rank}"

    @property
    def label(self) -> str:
        """Name for messages, e.g. ``worker 1 (local rank 0)``."""
        if self.local_rank is None:
            return self.short_name
        return f"{self.short_name} (local rank {self.local_rank})"

    @property
    def prefix(self) -> str:
        """What each relayed output line starts with, e.g. ``[worker 1] ``."""
        return f"[{self.short_name}] "

    def config(self) -> Config:
        """The Config this child will read; raises ConfigError naming a bad variable."""
        return Config.from_env(self.env)


@dataclasses.dataclass(frozen=True)
class JobPlan:
    """Every process of one bpslaunch invocation, in start order."""

    mode: str  # "embedded" or "role"
    distributed: bool
    processes: Tuple[ProcessSpec, ...]

    @property
    def workers(self) -> Tuple[ProcessSpec, ...]:
        return tuple(p for p in self.processes if p.is_worker)

    @property
    def services(self) -> Tuple[ProcessSpec, ...]:
        """The scheduler and servers: they serve the workers and stop after them."""
        return tuple(p for p in self.processes if not p.is_worker)

    def validate(self) -> None:
        """Check every child's environment through Config (raises ConfigError)."""
        for process in self.processes:
            process.config()

    def describe(self) -> str:
        """One line for the log, e.g. ``embedded job: scheduler, 1 server, 2 workers``."""
        servers = sum(p.role == "server" for p in self.processes)
        parts = [p.role for p in self.processes if p.role == "scheduler"]
        if servers:
            parts.append(f"{servers} server{'s' if servers != 1 else ''}")
        workers = len(self.workers)
        parts.append(f"{workers} worker process{'es' if workers != 1 else ''}")
        return f"{self.mode} job: {', '.join(parts)}"


def child_environment(
    base: Mapping[str, str], updates: Mapping[str, str], remove: Iterable[str] = ()
) -> dict:
    """``base`` minus ``remove`` plus ``updates``, with PYTHONUNBUFFERED=1.

    Unbuffered Python output is what lets bpslaunch relay each line as soon
    as the child prints it instead of when its 8 KiB buffer fills.
    """
    dropped = set(remove)
    env = {k: v for k, v in base.items() if k not in dropped}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(updates)
    return env


#: What ``horovodrun`` tells each process about its place in the job; bpslaunch sets them too.
HOROVOD_VARIABLES = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
                     "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE")


def horovod_variables(machine: int, machines: int, local_rank: int, local_size: int) -> dict:
    """Horovod's rank variables for worker ``local_rank`` of machine ``machine``, as horovodrun sets them.

    Scripts (and Horovod's own tests) read them before init; the worker's
    rank is ``machine * local_size + local_rank``, as the scheduler assigns it.
    """
    values = (machine * local_size + local_rank, machines * local_size, local_rank, local_size, machine, machines)
    return {name: str(value) for name, value in zip(HOROVOD_VARIABLES, values)}
