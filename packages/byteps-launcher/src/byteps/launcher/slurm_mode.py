"""Planning one node's share of a job inside a SLURM step (``srun bpslaunch python train.py``).

srun starts one bpslaunch per task; each task is one worker machine of the
job (one task per node is the usual layout; several tasks on one node work
too, each a machine of its own). From SLURM's variables every task agrees,
without talking, on the whole job:

* ``SLURM_NTASKS`` worker machines, this one ``SLURM_PROCID``
  (``DMLC_WORKER_ID``);
* the scheduler on the first host of ``SLURM_JOB_NODELIST`` (task 0 runs
  it), on a port derived from ``SLURM_JOB_ID`` and ``SLURM_STEP_ID``;
* this host's address: ``SLURMD_NODENAME`` (else the host name);
* a server on each task (co-located), or on the first K with ``--servers K``;
* ``-np L`` worker processes per task (default 1), i.e. BYTEPS_LOCAL_SIZE;
* the job id ``slurm<job>.<step>``. The job secret is BYTEPS_JOB_SECRET when
  the batch script exports one (examples/slurm/train.sbatch does), else the
  job has none, as a hand-started role-mode job.

Each task's bpslaunch then runs its processes as on one machine and ends
them all on the first failure; ``srun --kill-on-bad-exit=1`` ends the other
tasks, and the job's heartbeats end them too.

Example (task 1 of 2 on node ``c2``)::

    plan = slurm_plan({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "c[1-2]",
                       "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "c2"}, ["python", "t.py"])
"""

from __future__ import annotations

import re
import socket
from typing import List, Mapping, Optional, Sequence

from byteps.launcher.embedded_mode import OWNED_VARIABLES
from byteps.launcher.job_plan import SERVER_ARGV, JobPlan, ProcessSpec, UsageError, child_environment, worker_variables

__all__ = ["in_slurm_step", "slurm_plan", "expand_nodelist", "SLURM_PORTS"]

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
                raise UsageError(f"SLURM_JOB_NODELIST={text!r}: cannot read the range {part!r}")
            for number in range(int(low), int(high or low) + 1):
                hosts.append(f"{prefix}{str(number).zfill(len(low))}{suffix}")
    if not hosts:
        raise UsageError(f"SLURM_JOB_NODELIST={text!r} names no host")
    return hosts


def _number(environ: Mapping[str, str], name: str) -> int:
    raw = environ.get(name, "").strip()
    if not raw.isdigit():
        raise UsageError(f"{name}={raw!r}: srun sets it to a number in every task; run bpslaunch with srun "
                         "inside an allocation (sbatch or salloc)")
    return int(raw)


def slurm_plan(environ: Mapping[str, str], command: Sequence[str], local_size: Optional[int] = None,
               num_server: Optional[int] = None) -> JobPlan:
    """This task's processes; raises UsageError (naming the SLURM variable) or ConfigError."""
    if not command:
        raise UsageError("missing COMMAND: what should each worker process run?")
    if not environ.get("SLURM_JOB_NODELIST", "").strip():
        raise UsageError("SLURM_JOB_NODELIST is not set: bpslaunch under srun needs SLURM's node list to find "
                         "the scheduler's host (run it with srun inside an allocation)")
    tasks, task = _number(environ, "SLURM_NTASKS"), _number(environ, "SLURM_PROCID")
    job, step = _number(environ, "SLURM_JOB_ID"), _number(environ, "SLURM_STEP_ID")
    first = expand_nodelist(environ["SLURM_JOB_NODELIST"])[0]
    here = environ.get("SLURMD_NODENAME", "").strip() or socket.gethostname()
    size = local_size or 1
    servers = tasks if num_server is None else num_server
    if not 1 <= servers <= tasks:
        raise UsageError(f"--servers {servers}: between 1 and the {tasks} tasks (SLURM_NTASKS), one per task")
    port = SLURM_PORTS[0] + (job * 131 + step) % (SLURM_PORTS[1] - SLURM_PORTS[0])
    base = {k: v for k, v in environ.items() if k not in OWNED_VARIABLES}
    shared = {"DMLC_PS_ROOT_URI": first, "DMLC_PS_ROOT_PORT": str(port), "DMLC_NUM_WORKER": str(tasks),
              "DMLC_NUM_SERVER": str(servers), "DMLC_NODE_HOST": here,
              "BYTEPS_JOB_ID": base.get("BYTEPS_JOB_ID", "").strip() or f"slurm{job}.{step}"}

    def spec(role: str, argv: Sequence[str], extra: Mapping[str, str], **rank) -> ProcessSpec:
        return ProcessSpec(role, tuple(argv), child_environment(base, {**shared, "DMLC_ROLE": role, **extra}),
                           **rank)

    processes = [spec("scheduler", SERVER_ARGV, {})] if task == 0 else []
    if task < servers:
        processes.append(spec("server", SERVER_ARGV, {}, rank=task))
    for local_rank in range(size):
        processes.append(spec("worker", command, worker_variables(task, tasks, local_rank, size),
                              rank=task * size + local_rank, local_rank=local_rank))
    plan = JobPlan(mode="slurm", distributed=True, processes=tuple(processes))
    plan.validate()
    return plan
