"""Which logical CPUs each local worker process may run on (BytePS's core affinity).

A pure function of the machine (:class:`~byteps.launcher.topology.Topology`),
the number of local workers and the ``BYTEPS_*`` placement knobs of
:class:`~byteps.common.config.Config`; ``bpslaunch`` applies the result with
``sched_setaffinity`` before each worker starts. The rules:

* ``BYTEPS_NUMA_ON=0``: nobody is pinned (mode ``off``);
* ``BYTEPS_VISIBLE_CPU_CORES``: exactly the CPUs given, one colon-separated
  section per local worker (mode ``visible``); every CPU must be online and
  allowed for bpslaunch itself;
* otherwise (mode ``automatic``) each worker gets ``BYTEPS_NUMA_DEFAULT_QUOTA``
  whole physical cores (default: usable physical cores // workers), with
  all their usable hyperthreads unless ``BYTEPS_MULTITHREADED_CPU=0`` (then
  one thread per core), never a CPU of ``BYTEPS_CPU_BLACKLIST``, and no CPU
  shared between two workers. A worker whose GPU is known gets cores on its
  GPU's NUMA node first, then on the nearest nodes (SLIT distance). Workers
  without a known GPU are spread evenly: over packages, then over NUMA nodes
  in proportion to their usable cores, each worker inside one node when its
  quota fits, consecutive local ranks on the same or neighbouring nodes;
* when there are fewer usable physical cores than workers (a 2-core CI
  machine running 4 workers), no exclusive assignment exists: every worker
  gets all the usable CPUs (mode ``shared``), which still honours the
  blacklist and lets the kernel balance the load.

"Usable" means online, in ``allowed`` (bpslaunch's own affinity: a container
cpuset or ``taskset`` is respected) and not blacklisted. Hyperthread
siblings come from the kernel's ``thread_siblings_list``, never from the
``i`` / ``i + n`` numbering BytePS assumed.

Example::

    topo = read_topology()
    assignment = assign_cores(topo, Config.from_env(), workers=2)
    assignment.cpus      # ((0,), (1,)) on a 2-core machine
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from byteps.common.config import Config, ConfigError
from byteps.launcher.topology import Topology, format_cpu_list

__all__ = ["CoreAssignment", "assign_cores"]

Core = Tuple[int, ...]  # the threads of one physical core that a worker may use


@dataclasses.dataclass(frozen=True)
class CoreAssignment:
    """The CPUs of each local worker, in local-worker order; ``cpus`` is None when nobody is pinned."""

    mode: str  # "off", "visible", "automatic" or "shared"
    cpus: Optional[Tuple[Tuple[int, ...], ...]]
    note: str = ""  # why, when the result is not the plain automatic one

    def for_worker(self, index: int) -> Optional[Tuple[int, ...]]:
        """CPUs of local worker ``index``, or None when it is left unpinned."""
        return None if self.cpus is None else self.cpus[index]


def assign_cores(
    topology: Topology,
    config: Config,
    *,
    workers: Optional[int] = None,
    gpus: Optional[Sequence[Optional[int]]] = None,
    allowed: Optional[Iterable[int]] = None,
) -> CoreAssignment:
    """Assign CPUs to ``workers`` local workers (default ``config.local_size``).

    ``gpus[i]`` is the GPU (index into ``topology.gpus``) of local worker
    ``i``, None when unknown; by default worker ``i`` uses GPU ``i`` when the
    topology has one. ``allowed`` is the set of CPUs the caller may use
    (default: every online CPU). Raises ConfigError naming the variable
    whose value cannot be honoured on this machine.
    """
    count = config.local_size if workers is None else workers
    if count < 1:
        raise ValueError(f"workers must be >= 1, got {count}")
    if not config.numa_on:
        return CoreAssignment("off", None, "BYTEPS_NUMA_ON=0: workers are not pinned")
    online = set(topology.online)
    allowed = online if allowed is None else set(allowed)
    usable = online & allowed
    if not usable:
        raise ValueError(f"none of the CPUs this process may use ({format_cpu_list(allowed)}) is online "
                         f"(online: {format_cpu_list(online)})")
    if config.visible_cpu_cores is not None:
        return _visible(config.visible_cpu_cores, count, count == config.local_size, online, usable)

    blacklist = set(config.cpu_blacklist)
    cores = []
    for core in topology.physical_cores():
        threads = tuple(cpu for cpu in core if cpu in usable and cpu not in blacklist)
        if threads:
            cores.append(threads if config.multithreaded_cpu else threads[:1])
    if not cores:
        raise ConfigError("BYTEPS_CPU_BLACKLIST", f"{format_cpu_list(blacklist)} leaves no CPU to run workers on "
                                                  f"(usable otherwise: {format_cpu_list(usable)})")
    quota = config.numa_default_quota
    if quota is None:
        quota = len(cores) // count
        if quota == 0:
            everything = tuple(sorted(cpu for core in cores for cpu in core))
            note = (f"{count} local workers but only {len(cores)} usable physical cores: every worker may run on "
                    f"all of them ({format_cpu_list(everything)}); set BYTEPS_VISIBLE_CPU_CORES to pin explicitly")
            return CoreAssignment("shared", (everything,) * count, note)
    elif quota * count > len(cores):
        raise ConfigError("BYTEPS_NUMA_DEFAULT_QUOTA", (
            f"{quota} physical cores x {count} local workers = {quota * count}, but only {len(cores)} physical "
            "cores are usable (online, allowed for this process, not in BYTEPS_CPU_BLACKLIST); lower it or unset "
            "it for an even share"))
    gpu_nodes = _gpu_nodes(topology, count, gpus)
    chosen = _Allocator(topology, cores).allocate(count, quota, gpu_nodes)
    note = "" if any(node is not None for node in gpu_nodes) else "no GPU known: workers spread over NUMA nodes"
    return CoreAssignment("automatic", tuple(tuple(sorted(cpu for core in c for cpu in core)) for c in chosen), note)


def _visible(
    sections: Tuple[Tuple[int, ...], ...], count: int, is_local_size: bool, online: set, usable: set
) -> CoreAssignment:
    """BYTEPS_VISIBLE_CPU_CORES, checked against the machine: it overrides everything else."""
    variable = "BYTEPS_VISIBLE_CPU_CORES"
    if len(sections) != count:
        raise ConfigError(variable, (
            f"has {len(sections)} section{'s' if len(sections) != 1 else ''} but {count} local worker "
            f"process{'es' if count != 1 else ''} run on this machine{' (BYTEPS_LOCAL_SIZE)' if is_local_size else ''}"
            "; give one colon-separated CPU list per worker"))
    for index, section in enumerate(sections):
        missing = [cpu for cpu in section if cpu not in online]
        if missing:
            raise ConfigError(variable, f"section {index} names CPU {format_cpu_list(missing)}, not online on this "
                                        f"machine (online CPUs: {format_cpu_list(online)})")
        forbidden = [cpu for cpu in section if cpu not in usable]
        if forbidden:
            raise ConfigError(variable, f"section {index} names CPU {format_cpu_list(forbidden)}, outside the CPUs "
                                        f"this process may use ({format_cpu_list(usable)}; a cpuset or taskset)")
    return CoreAssignment("visible", tuple(tuple(section) for section in sections))


def _gpu_nodes(topology: Topology, count: int, gpus: Optional[Sequence[Optional[int]]]) -> List[Optional[int]]:
    """The NUMA node of each worker's GPU, None where unknown."""
    if gpus is None:
        gpus = [i if i < len(topology.gpus) else None for i in range(count)]
    elif len(gpus) != count:
        raise ValueError(f"gpus names {len(gpus)} workers' GPUs, expected {count}")
    by_index = {gpu.index: gpu.numa_node for gpu in topology.gpus}
    return [None if gpu is None else by_index.get(gpu) for gpu in gpus]


class _Allocator:
    """Hands out whole physical cores, node by node, never the same core twice."""

    def __init__(self, topology: Topology, cores: Sequence[Core]) -> None:
        node_of = {cpu.id: cpu.numa_node for cpu in topology.cpus}
        package_of = {cpu.id: cpu.package_id for cpu in topology.cpus}
        self.nodes = {node.id: node for node in topology.nodes}
        self.free: Dict[int, List[Core]] = {}
        self.package: Dict[int, int] = {}
        for core in cores:  # already ordered by lowest CPU id
            node = node_of[core[0]]
            self.free.setdefault(node, []).append(core)
            self.package.setdefault(node, package_of[core[0]])

    def take(self, node: int, n: int) -> List[Core]:
        taken, self.free[node] = self.free[node][:n], self.free[node][n:]
        return taken

    def spill(self, near: int, n: int) -> List[Core]:
        """``n`` cores from the nodes nearest ``near`` (then fullest, then lowest id)."""
        taken: List[Core] = []
        while len(taken) < n:
            node = min((j for j in self.free if self.free[j]),
                       key=lambda j: (self.nodes[near].distance_to(j) if near in self.nodes else 0,
                                      -len(self.free[j]), j))
            taken += self.take(node, n - len(taken))
        return taken

    def allocate(self, count: int, quota: int, gpu_nodes: Sequence[Optional[int]]) -> List[List[Core]]:
        chosen: List[List[Core]] = [[] for _ in range(count)]
        placed = [w for w in range(count) if gpu_nodes[w] is not None]
        for w in placed:  # first every GPU worker's share of its own node, then the shortfalls
            node = gpu_nodes[w]
            chosen[w] = self.take(node, quota) if node in self.free else []
        for w in placed:
            chosen[w] += self.spill(gpu_nodes[w], quota - len(chosen[w]))

        rest = [w for w in range(count) if gpu_nodes[w] is None]
        homes = self._spread(len(rest), quota)
        for w, node in zip(rest, homes):
            chosen[w] = self.take(node, quota)
        for w in rest[len(homes):]:  # no node has room for a whole quota: straddle, from the fullest node out
            fullest = min((j for j in self.free if self.free[j]), key=lambda j: (-len(self.free[j]), j))
            chosen[w] = self.spill(fullest, quota)
        return chosen

    def _spread(self, count: int, quota: int) -> List[int]:
        """Home nodes for ``count`` workers, each able to hold a whole quota, in node order.

        Each next worker goes to the node whose package, then itself, is
        least loaded relative to its free cores; listing the homes by node id
        keeps consecutive local ranks together. May return fewer homes than
        ``count`` when the free cores are too fragmented.
        """
        fits = {j: len(cores) // quota for j, cores in self.free.items()}
        capacity = {j: len(cores) for j, cores in self.free.items()}
        package_capacity: Dict[int, int] = {}
        for j, cores in self.free.items():
            package_capacity[self.package[j]] = package_capacity.get(self.package[j], 0) + len(cores)
        load = dict.fromkeys(fits, 0)
        package_load = dict.fromkeys(package_capacity, 0)
        for _ in range(count):
            open_nodes = [j for j in fits if load[j] < fits[j]]
            if not open_nodes:
                break
            node = min(open_nodes, key=lambda j: (package_load[self.package[j]] / package_capacity[self.package[j]],
                                                  load[j] / capacity[j], j))
            load[node] += 1
            package_load[self.package[node]] += 1
        return [j for j in sorted(load) for _ in range(load[j])]
