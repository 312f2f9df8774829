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
import secrets
import sys
from typing import Any, Iterable, Mapping, Optional, Tuple

from byteps.common.config import Config

__all__ = ["ProcessSpec", "JobPlan", "UsageError", "SERVER_ARGV", "child_environment", "horovod_variables",
           "HOROVOD_VARIABLES", "worker_variables", "job_identity"]

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
    host: Optional[str] = None  # started over ssh on this host (ssh mode); None: on this machine

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
        where = f" on {self.host}" if self.host else ""
        if self.local_rank is None:
            return self.short_name + where
        return f"{self.short_name} (local rank {self.local_rank}){where}"

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

    mode: str  # "embedded", "role", "ssh" or "slurm"
    distributed: bool
    processes: Tuple[ProcessSpec, ...]
    ssh: Any = None  # byteps.launcher.ssh.SshOptions in ssh mode: how remote children are reached

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
        """The plan in one line, printed once at the start of a job, e.g.

        ``embedded job: scheduler on 127.0.0.1:40123, 1 server, 2 worker processes
        (2 machines x 1); 512000-byte partitions, TCP to the servers``
        """
        config = (self.workers or self.processes)[0].config()  # a worker knows the local size
        servers = sum(p.role == "server" for p in self.processes)
        workers = len(self.workers)
        # A role-mode scheduler or server is part of a distributed job whatever its own variables say (BytePS's
        # tests start them without BYTEPS_FORCE_DISTRIBUTED for their one forced worker).
        distributed = config.is_distributed or not workers
        parts = []
        if distributed:
            where = f"{config.root_uri}:{config.root_port}"
            parts.append(f"scheduler on {where}" if any(p.role == "scheduler" for p in self.processes)
                         else f"scheduler at {where}")
        if servers and self.mode in ("embedded", "ssh"):
            parts.append(_count(servers, "server"))
        if workers:
            text = _count(workers, "worker process", "worker processes")
            if self.mode == "slurm":
                text += (f" here, on worker machine {config.worker_id} of {config.num_worker} "
                         f"(SLURM task {self.workers[0].env.get('SLURM_PROCID', config.worker_id)})")
            elif self.mode == "ssh":
                hosts = list(dict.fromkeys(p.host or "localhost" for p in self.workers))
                text += f" ({_count(len(hosts), 'host')} x {config.local_size}: {', '.join(hosts)})"
            elif self.mode == "embedded" and config.is_distributed:
                text += f" ({_count(config.num_worker, 'machine')} x {config.local_size})"
            elif self.mode == "role":
                text += f" on worker machine {config.worker_id} of {config.num_worker}"
            parts.append(text)
        if self.mode == "role" and not workers:
            parts.append(f"for {_count(config.num_server, 'server')} and {_count(config.num_worker, 'worker machine')}")
        if not distributed:
            parts.append("no scheduler or servers (one process needs none)")
        else:
            paths = []
            if config.num_server:
                paths.append("TCP to the servers")
            if config.local_size > 1:
                paths.append("shared memory inside a machine")
            parts.append(f"{config.partition_bytes}-byte partitions" + (", " + " and ".join(paths) if paths else ""))
        mode = {"embedded": "embedded job", "ssh": "job over ssh", "slurm": "SLURM task"}.get(
            self.mode, f"role mode ({config.role})")
        return f"{mode}: {', '.join(parts)}"


def _count(n: int, singular: str, plural: str = "") -> str:
    return f"{n} {singular if n == 1 else plural or singular + 's'}"


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


def worker_variables(machine: int, machines: int, local_rank: int, local_size: int) -> dict:
    """A worker process's place in the job: DMLC_WORKER_ID, BYTEPS_LOCAL_RANK, BYTEPS_LOCAL_SIZE and Horovod's."""
    return {"DMLC_WORKER_ID": str(machine), "BYTEPS_LOCAL_RANK": str(local_rank), "BYTEPS_LOCAL_SIZE": str(local_size),
            **horovod_variables(machine, machines, local_rank, local_size)}


def job_identity(environ: Mapping[str, str]) -> dict:
    """``environ``'s BYTEPS_JOB_SECRET and BYTEPS_JOB_ID, else new ones: one secret per job, so that no other
    process can join it, and one id naming its shared memory and local sockets, so two jobs never collide."""
    return {"BYTEPS_JOB_SECRET": environ.get("BYTEPS_JOB_SECRET", "").strip() or secrets.token_hex(32),
            "BYTEPS_JOB_ID": environ.get("BYTEPS_JOB_ID", "").strip() or secrets.token_hex(6)}
