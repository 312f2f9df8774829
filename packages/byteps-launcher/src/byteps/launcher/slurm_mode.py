"""Planning one node's share of a job inside a SLURM step (``srun bpslaunch python train.py``).

srun starts one bpslaunch per task. From SLURM's variables every task
agrees, without talking, on the whole job. Two layouts:

* **a task per worker process** (no ``-np``, and the step has the same
  L > 1 tasks on every node: ``SLURM_STEP_TASKS_PER_NODE``, else
  ``SLURM_NTASKS_PER_NODE``): each node is a worker machine
  (``SLURM_NODEID`` of ``SLURM_STEP_NUM_NODES``) and each task one of its L
  worker processes (``SLURM_LOCALID`` = local rank); the node's local task
  0 also runs the node's server (and on node 0 the scheduler);
* **a task per worker machine** (otherwise: one task per node, uneven
  tasks, or ``-np`` given): ``SLURM_NTASKS`` worker machines, this one
  ``SLURM_PROCID`` (``DMLC_WORKER_ID``), each running L worker processes:
  ``-np L`` if given, else ``SLURM_GPUS_ON_NODE`` (one per GPU of the
  node) when SLURM gave GPUs, else 1.

So the order is: ``-np`` wins over SLURM's variables, which win over the
default of one worker per task. In both layouts:

* the scheduler on the first host of the step's node list
  (``SLURM_STEP_NODELIST``; the job's, ``SLURM_JOB_NODELIST``, only when
  the step's is absent), so that a step on part of an allocation (``srun
  -w``, ``-r``) finds it on one of its own nodes; its port is derived from
  ``SLURM_JOB_ID`` and ``SLURM_STEP_ID``;
* this host's address: ``SLURMD_NODENAME`` (else the host name);
* a server on each worker machine (co-located), or on the first K with
  ``--servers K``;
* the job id ``slurm<job>.<step>``. The job secret is BYTEPS_JOB_SECRET when
  the batch script exports one (examples/slurm/train.sbatch does), else the
  job has none, as a hand-started role-mode job.

Each task's bpslaunch then runs its processes as on one machine and ends
them all on the first failure; ``srun --kill-on-bad-exit=1`` ends the other
tasks, and the job's heartbeats end them too.

Example (task 1 of 2 on node ``c2``)::

    plan = slurm_plan({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_STEP_NODELIST": "c[1-2]",
                       "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "c2"}, ["python", "t.py"])
"""

from __future__ import annotations

import dataclasses
import re
import socket
from typing import List, Mapping, Optional, Sequence

from byteps.launcher.embedded_mode import OWNED_VARIABLES
from byteps.launcher.job_plan import SERVER_ARGV, JobPlan, ProcessSpec, UsageError, child_environment, worker_variables

__all__ = ["in_slurm_step", "slurm_plan", "slurm_layout", "SlurmLayout", "expand_nodelist", "SLURM_PORTS"]

#: The scheduler's port is SLURM_PORTS[0] + (a number from the job and step ids) % the range's width.
SLURM_PORTS = (20000, 40000)


def in_slurm_step(environ: Mapping[str, str]) -> bool:
    """Whether this process is a task of an srun step (not a batch script's own shell)."""
    return bool(environ.get("SLURM_PROCID", "").strip()) and environ.get("SLURM_STEP_ID", "").strip().isdigit() \
        and int(environ["SLURM_STEP_ID"]) < 0xFFFFFFF0


def expand_nodelist(text: str) -> List[str]:
    """SLURM's compressed host list, e.g. ``c[1-3,07],gpu1`` -> ``c1 c2 c3 c07 gpu1``."""
    hosts: List[str] = []
    for match in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?([^,]*)", text):
        prefix, ranges, suffix = match.group(1), match.group(2), match.group(3)
        if not ranges:
            hosts.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            if not low.isdigit() or (high and not high.isdigit()):
                raise UsageError(f"SLURM node list {text!r}: cannot read the range {part!r}")
            for number in range(int(low), int(high or low) + 1):
                hosts.append(f"{prefix}{str(number).zfill(len(low))}{suffix}")
    if not hosts:
        raise UsageError(f"SLURM node list {text!r} names no host")
    return hosts


def _number(environ: Mapping[str, str], name: str) -> int:
    raw = environ.get(name, "").strip()
    if not raw.isdigit():
        raise UsageError(f"{name}={raw!r}: srun sets it to a number in every task; run bpslaunch with srun "
                         "inside an allocation (sbatch or salloc)")
    return int(raw)


@dataclasses.dataclass(frozen=True)
class SlurmLayout:
    """Where this task sits in the job: which worker machine, and which of its worker processes it runs."""

    machines: int  # DMLC_NUM_WORKER
    machine: int  # DMLC_WORKER_ID
    local_size: int  # worker processes per machine (BYTEPS_LOCAL_SIZE)
    local_ranks: range  # the local ranks this task runs
    runs_services: bool  # this task runs its machine's server (if the machine has one) and, on machine 0, the scheduler


def _optional_number(environ: Mapping[str, str], name: str) -> Optional[int]:
    """A count SLURM sets only in some jobs; None when unset."""
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise UsageError(f"{name}={raw!r}: expected a number of SLURM's")
    return int(raw)


def _tasks_per_node(environ: Mapping[str, str]) -> Optional[int]:
    """The step's tasks on every node, when it is the same on all; None when unknown or uneven.

    ``SLURM_STEP_TASKS_PER_NODE`` (what srun really placed, e.g. ``2(x3)``) first: a batch script's
    ``SLURM_NTASKS_PER_NODE`` is inherited by every step, also by one that asked for fewer tasks."""
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"):
        raw = environ.get(name, "").strip()
        if not raw:
            continue
        counts = set()
        for part in raw.split(","):
            found = re.fullmatch(r"(\d+)(?:\(x\d+\))?", part.strip())
            if not found:
                raise UsageError(f"{name}={raw!r}: cannot read SLURM's task counts")
            counts.add(int(found.group(1)))
        return counts.pop() if len(counts) == 1 else None
    return None


def slurm_layout(environ: Mapping[str, str], local_size: Optional[int] = None) -> SlurmLayout:
    """This task's place; ``local_size`` is ``-np``, which wins over SLURM's variables (see the module docstring)."""
    tasks, task = _number(environ, "SLURM_NTASKS"), _number(environ, "SLURM_PROCID")
    if local_size is not None:
        return SlurmLayout(tasks, task, local_size, range(local_size), True)
    per_node = _tasks_per_node(environ)
    if per_node is not None and per_node > 1:
        nodes = _number(environ, "SLURM_STEP_NUM_NODES" if environ.get("SLURM_STEP_NUM_NODES") else "SLURM_NNODES")
        if nodes * per_node != tasks:
            raise UsageError(f"{per_node} tasks per node on {nodes} nodes is not SLURM_NTASKS={tasks}: a task per "
                             "worker process needs the same number of tasks on every node (or give -np)")
        node, local = _number(environ, "SLURM_NODEID"), _number(environ, "SLURM_LOCALID")
        return SlurmLayout(nodes, node, per_node, range(local, local + 1), local == 0)
    gpus = _optional_number(environ, "SLURM_GPUS_ON_NODE")
    if gpus:
        return SlurmLayout(tasks, task, gpus, range(gpus), True)
    return SlurmLayout(tasks, task, 1, range(1), True)


def slurm_plan(environ: Mapping[str, str], command: Sequence[str], local_size: Optional[int] = None,
               num_server: Optional[int] = None) -> JobPlan:
    """This task's processes; raises UsageError (naming the SLURM variable) or ConfigError."""
    if not command:
        raise UsageError("missing COMMAND: what should each worker process run?")
    nodelist_name = "SLURM_STEP_NODELIST" if environ.get("SLURM_STEP_NODELIST", "").strip() else "SLURM_JOB_NODELIST"
    if not environ.get(nodelist_name, "").strip():
        raise UsageError("SLURM_STEP_NODELIST and SLURM_JOB_NODELIST are not set: bpslaunch under srun needs "
                         "SLURM's node list to find the scheduler's host (run it with srun inside an allocation)")
    layout = slurm_layout(environ, local_size)
    job, step = _number(environ, "SLURM_JOB_ID"), _number(environ, "SLURM_STEP_ID")
    first = expand_nodelist(environ[nodelist_name])[0]
    here = environ.get("SLURMD_NODENAME", "").strip() or socket.gethostname()
    machines = layout.machines
    servers = machines if num_server is None else num_server
    if not 1 <= servers <= machines:
        raise UsageError(f"--servers {servers}: between 1 and the {machines} worker machines, one per machine")
    port = SLURM_PORTS[0] + (job * 131 + step) % (SLURM_PORTS[1] - SLURM_PORTS[0])
    base = {k: v for k, v in environ.items() if k not in OWNED_VARIABLES}
    shared = {"DMLC_PS_ROOT_URI": first, "DMLC_PS_ROOT_PORT": str(port), "DMLC_NUM_WORKER": str(machines),
              "DMLC_NUM_SERVER": str(servers), "DMLC_NODE_HOST": here,
              "BYTEPS_JOB_ID": base.get("BYTEPS_JOB_ID", "").strip() or f"slurm{job}.{step}"}

    def spec(role: str, argv: Sequence[str], extra: Mapping[str, str], **rank) -> ProcessSpec:
        return ProcessSpec(role, tuple(argv), child_environment(base, {**shared, "DMLC_ROLE": role, **extra}),
                           **rank)

    machine, size = layout.machine, layout.local_size
    processes = [spec("scheduler", SERVER_ARGV, {})] if machine == 0 and layout.runs_services else []
    if machine < servers and layout.runs_services:
        processes.append(spec("server", SERVER_ARGV, {}, rank=machine))
    for local_rank in layout.local_ranks:
        processes.append(spec("worker", command, worker_variables(machine, machines, local_rank, size),
                              rank=machine * size + local_rank, local_rank=local_rank))
    plan = JobPlan(mode="slurm", distributed=True, processes=tuple(processes))
    plan.validate()
    return plan
