"""Which CPUs each worker process bpslaunch starts may run on, and pinning it there.

bpslaunch plans the job, then :func:`place_workers` reads this machine's
topology (:mod:`byteps.launcher.topology`), asks
:func:`byteps.launcher.core_assignment.assign_cores` for each local worker's
CPUs under the ``BYTEPS_NUMA_ON`` / ``BYTEPS_VISIBLE_CPU_CORES`` /
``BYTEPS_CPU_BLACKLIST`` / ``BYTEPS_MULTITHREADED_CPU`` /
``BYTEPS_NUMA_DEFAULT_QUOTA`` knobs, and records them in each worker's
:class:`~byteps.launcher.job_plan.ProcessSpec` (``cpus``). A bad value is a
ConfigError naming the variable, before anything starts.

:func:`pin_in_child` then runs in the child between fork and exec, so the
affinity is in place before the program starts its first thread (threads
inherit it; ``sched_setaffinity`` on a running process would only move its
main thread).

Only worker processes are pinned: the scheduler and servers keep
bpslaunch's own affinity, so on a small machine they can run wherever a
worker leaves room. In embedded mode every worker process of the job runs
on this machine, so all of them (``--workers`` x ``-np``) share its cores;
in role mode the ``BYTEPS_LOCAL_SIZE`` workers do.

A worker's GPU is its local rank, mapped through ``CUDA_VISIBLE_DEVICES``
when that lists GPU indices or UUIDs (``CUDA_VISIBLE_DEVICES=3,7``: local
rank 0 uses GPU 3). Indices are NVML's (PCI bus order), which is CUDA's
order with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``. Without it,
``NVIDIA_VISIBLE_DEVICES`` (the NVIDIA container runtime's list: indices,
UUIDs, ``all``, or ``none``/``void``) maps the same way; when both are set,
``CUDA_VISIBLE_DEVICES`` wins, as CUDA applies it to whatever the runtime
left visible. Where the runtime already applied the list (the launcher runs
inside that container), NVML sees only those GPUs, numbered from 0; an
index past them is then read as a position in the list (docs/gpu.md).

Example::

    plan = place_workers(embedded_plan(options, command, os.environ))
    [spec.cpus for spec in plan.workers]      # [(0,), (1,)] on a 2-core machine, -np 2
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Iterable, List, Optional, Sequence

from byteps.launcher.core_assignment import CoreAssignment, assign_cores
from byteps.launcher.job_plan import JobPlan, ProcessSpec
from byteps.launcher.topology import Topology, TopologyError, format_cpu_list, read_topology

__all__ = ["place_workers", "pin_in_child", "gpu_of", "visible_devices"]


def visible_devices(env: Any) -> Optional[str]:
    """The list of GPUs a process may use: ``CUDA_VISIBLE_DEVICES``, else ``NVIDIA_VISIBLE_DEVICES``; None: all."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return visible
    visible = env.get("NVIDIA_VISIBLE_DEVICES")
    if visible is None or visible.strip().lower() == "all":
        return None
    return "" if visible.strip().lower() in ("none", "void") else visible


def gpu_of(spec: ProcessSpec, topology: Topology) -> Optional[int]:
    """The NVML index of the GPU this worker will use, or None when unknown."""
    local_rank = spec.local_rank or 0
    visible = visible_devices(spec.env)
    if visible is None:
        return local_rank if local_rank < len(topology.gpus) else None
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    if local_rank >= len(entries):
        return None
    entry = entries[local_rank]
    if entry.isdigit():
        index = int(entry)
        if "CUDA_VISIBLE_DEVICES" not in spec.env and index >= len(topology.gpus) == len(entries):
            return local_rank  # the container runtime applied the list already: NVML numbers what is left
        return index
    matches = [gpu.index for gpu in topology.gpus if gpu.uuid and gpu.uuid.startswith(entry)]
    return matches[0] if len(matches) == 1 else None


def place_workers(
    plan: JobPlan,
    *,
    report: Optional[Callable[[str], None]] = None,
    sysfs_root: str = "/sys",
    nvml: Any = None,
    allowed: Optional[Iterable[int]] = None,
) -> JobPlan:
    """``plan`` with each worker's ``cpus`` set; raises ConfigError naming a bad placement knob.

    ``report`` receives one line per decision (bpslaunch passes its console
    when ``BYTEPS_LOG_LEVEL`` is INFO or more verbose). ``allowed`` defaults
    to bpslaunch's own affinity; ``sysfs_root`` and ``nvml`` are for tests.
    """
    say = report or (lambda line: None)
    workers = plan.workers
    if not workers:
        return plan
    config = workers[0].config()
    if not config.numa_on:
        say("BYTEPS_NUMA_ON=0: worker processes are not pinned")
        return plan
    # BYTEPS_PCIE_SWITCH_SIZE set: BytePS's index rule; unset: the switches NVML reports (docs/topology.md)
    switch_size = config.pcie_switch_size if workers[0].env.get("BYTEPS_PCIE_SWITCH_SIZE", "").strip() else None
    try:
        topology = read_topology(sysfs_root, gpus=config.visible_cpu_cores is None,
                                 pcie_switch_size=switch_size, nvml=nvml)
    except TopologyError as exc:
        say(f"cannot read this machine's CPU topology ({exc}); worker processes are not pinned")
        return plan
    say(f"topology: {topology.describe()}")
    allowed = os.sched_getaffinity(0) if allowed is None else set(allowed)
    gpus = [gpu_of(spec, topology) for spec in workers]
    assignment = assign_cores(topology, config, workers=len(workers), gpus=gpus, allowed=allowed)
    for line in _describe(assignment, workers, topology, gpus):
        say(line)
    if assignment.cpus is None:
        return plan
    cpus_of = {id(spec): cpus for spec, cpus in zip(workers, assignment.cpus)}
    processes = tuple(
        dataclasses.replace(spec, cpus=cpus_of[id(spec)]) if id(spec) in cpus_of else spec
        for spec in plan.processes
    )
    return dataclasses.replace(plan, processes=processes)


def _describe(assignment: CoreAssignment, workers: Sequence[ProcessSpec], topology: Topology,
              gpus: Sequence[Optional[int]]) -> List[str]:
    lines = [f"CPU placement ({assignment.mode})" + (f": {assignment.note}" if assignment.note else "")]
    if assignment.cpus is None:
        return lines
    node_of = {cpu.id: cpu.numa_node for cpu in topology.cpus}
    for spec, cpus, gpu in zip(workers, assignment.cpus, gpus):
        nodes = format_cpu_list({node_of[cpu] for cpu in cpus if cpu in node_of})
        where = f"NUMA node {nodes}" + ("" if gpu is None else f", GPU {gpu}")
        lines.append(f"  {spec.label}: CPUs {format_cpu_list(cpus)} ({where})")
    return lines


def pin_in_child(cpus: Iterable[int]) -> None:
    """Pin the calling process (a child between fork and exec) to ``cpus``.

    Failing here cannot stop the child cleanly (an exception in preexec_fn
    becomes an opaque SubprocessError in bpslaunch), and the plan was
    checked against the machine moments ago: a CPU that went offline since
    is only worth a warning on the child's stderr, which bpslaunch relays.
    """
    wanted = sorted(cpus)
    try:
        os.sched_setaffinity(0, wanted)
    except OSError as exc:
        message = f"bpslaunch: could not pin to CPUs {format_cpu_list(wanted)} ({exc}); running unpinned\n"
        try:
            os.write(2, message.encode())
        except OSError:
            pass
