"""What this machine is made of: logical CPUs, physical cores, NUMA nodes and GPUs.

BytePS pins each local worker to cores on the NUMA node of its GPU. To do
that without guessing, :func:`read_topology` reads the kernel's own
description from sysfs instead of assuming a numbering (BytePS assumed the
two hyperthreads of physical core ``i`` are logical CPUs ``i`` and ``i + n``,
which is false on many desktops and on hybrid Intel parts, where siblings
are adjacent):

* ``devices/system/cpu/online``: the online logical CPUs;
* ``devices/system/cpu/cpuN/topology/{core_id,physical_package_id,thread_siblings_list}``;
* ``devices/system/node/nodeN/{cpulist,distance}``: NUMA nodes (no ``node``
  directory, e.g. a kernel without NUMA: one node 0 with every CPU);
* GPUs, when ``pynvml`` can talk to a driver: each GPU's PCI bus id, its
  NUMA node from ``bus/pci/devices/<bus id>/numa_node`` and its PCIe switch.

The root is a parameter so that tests read recorded trees
(``tests/fixtures/sysfs``) exactly as they read this machine's ``/sys``.

Example::

    from byteps.launcher.topology import read_topology
    topo = read_topology()                    # this machine, GPUs through pynvml if any
    topo.describe()    # '1 package, 2 cores, 2 CPUs, 1 NUMA node (0: 0-1), no GPU'
    topo.physical_cores()                     # ((0,), (1,)): hyperthread siblings grouped
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = ["LogicalCpu", "NumaNode", "Gpu", "Topology", "TopologyError", "read_topology", "read_gpus",
           "format_cpu_list"]

#: Distance the kernel reports from a node to itself, and what we assume
#: between two different nodes when the ``distance`` file is missing.
LOCAL_DISTANCE, REMOTE_DISTANCE = 10, 20


class TopologyError(OSError):
    """The sysfs tree does not describe any online CPU."""


@dataclasses.dataclass(frozen=True)
class LogicalCpu:
    """One online logical CPU (a hardware thread)."""

    id: int
    core_id: int  # the kernel's core_id: unique within a package only, and often with gaps
    package_id: int  # physical socket
    numa_node: int
    siblings: Tuple[int, ...]  # online hardware threads of the same physical core, this one included


@dataclasses.dataclass(frozen=True)
class NumaNode:
    """One NUMA node; ``cpus`` is empty for a memory-only node (CXL, HBM, PMem)."""

    id: int
    cpus: Tuple[int, ...]
    distances: Dict[int, int] = dataclasses.field(default_factory=dict, hash=False)  # node id -> SLIT distance

    def distance_to(self, other: int) -> int:
        if other == self.id:
            return LOCAL_DISTANCE
        return self.distances.get(other, REMOTE_DISTANCE)


@dataclasses.dataclass(frozen=True)
class Gpu:
    """One GPU as NVML enumerates it (PCI bus order, not necessarily CUDA's order)."""

    index: int
    pci_bus_id: str  # normalised to sysfs form, e.g. "0000:3b:00.0"
    numa_node: int
    pcie_switch: int  # GPUs with the same number share a PCIe switch
    uuid: str = ""


@dataclasses.dataclass(frozen=True)
class Topology:
    """The machine as :func:`read_topology` found it (online CPUs only)."""

    cpus: Tuple[LogicalCpu, ...]
    nodes: Tuple[NumaNode, ...]
    gpus: Tuple[Gpu, ...] = ()

    @property
    def online(self) -> Tuple[int, ...]:
        return tuple(cpu.id for cpu in self.cpus)

    @property
    def packages(self) -> Tuple[int, ...]:
        return tuple(sorted({cpu.package_id for cpu in self.cpus}))

    def cpu(self, cpu_id: int) -> LogicalCpu:
        for cpu in self.cpus:
            if cpu.id == cpu_id:
                return cpu
        raise KeyError(f"CPU {cpu_id} is not online")

    def node(self, node_id: int) -> NumaNode:
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise KeyError(f"no NUMA node {node_id}")

    def physical_cores(self) -> Tuple[Tuple[int, ...], ...]:
        """Online hardware threads grouped by physical core, ordered by their lowest CPU id."""
        seen, cores = set(), []
        for cpu in self.cpus:
            if cpu.id not in seen:
                seen.update(cpu.siblings)
                cores.append(cpu.siblings)
        return tuple(cores)

    def describe(self) -> str:
        """One line for logs, e.g. ``2 packages, 40 cores, 80 CPUs, 2 NUMA nodes (0: 0-19,40-59; ...)``."""

        def count(n: int, word: str) -> str:
            return f"{n} {word}{'' if n == 1 else 's'}"

        nodes = "; ".join(f"{n.id}: {format_cpu_list(n.cpus) or 'no CPU'}" for n in self.nodes)
        gpus = count(len(self.gpus), "GPU") if self.gpus else "no GPU"
        return (f"{count(len(self.packages), 'package')}, {count(len(self.physical_cores()), 'core')}, "
                f"{count(len(self.cpus), 'CPU')}, {count(len(self.nodes), 'NUMA node')} ({nodes}), {gpus}")


def format_cpu_list(cpus: Iterable[int]) -> str:
    """The kernel's compact form: ``[0, 1, 2, 5]`` -> ``"0-2,5"`` (inverse of config.parse_cpu_list)."""
    ids = sorted(set(cpus))
    ranges: List[str] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[i - 1] + 1:
            first, last = ids[start], ids[i - 1]
            ranges.append(str(first) if first == last else f"{first}-{last}")
            start = i
    return ",".join(ranges)


def _parse_list(text: str) -> Tuple[int, ...]:
    cpus = set()
    for item in text.strip().split(","):
        item = item.strip()
        if item:
            low, _, high = item.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
    return tuple(sorted(cpus))


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _read_int(path: str, default: int) -> int:
    text = _read(path)
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def _numbered(directory: str, prefix: str) -> List[int]:
    """The N of every ``prefixN`` entry in ``directory``, sorted."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    pattern = re.compile(re.escape(prefix) + r"(\d+)$")
    return sorted(int(m.group(1)) for m in map(pattern.match, names) if m)


def _online_cpus(cpu_dir: str) -> Tuple[int, ...]:
    text = _read(os.path.join(cpu_dir, "online"))
    if text is not None:
        return _parse_list(text)
    # Very old or stripped-down sysfs: every cpuN directory counts as online.
    return tuple(_numbered(cpu_dir, "cpu"))


def _sibling_groups(online: Sequence[int], listed: Dict[int, Tuple[int, ...]]) -> Dict[int, Tuple[int, ...]]:
    """CPU -> its core's online threads; a union of the kernel's lists, so inconsistent lists cannot split a core."""
    parent = {cpu: cpu for cpu in online}

    def root(cpu: int) -> int:
        while parent[cpu] != cpu:
            parent[cpu] = parent[parent[cpu]]
            cpu = parent[cpu]
        return cpu

    for cpu, siblings in listed.items():
        for other in siblings:
            if other in parent:
                parent[root(other)] = root(cpu)
    groups: Dict[int, List[int]] = {}
    for cpu in online:
        groups.setdefault(root(cpu), []).append(cpu)
    return {cpu: tuple(group) for group in groups.values() for cpu in group}


def _read_nodes(node_dir: str, online: Tuple[int, ...]) -> Tuple[NumaNode, ...]:
    ids = _numbered(node_dir, "node")
    if not ids:
        return (NumaNode(0, online, {0: LOCAL_DISTANCE}),)
    online_set, claimed, nodes = set(online), set(), []
    for node_id in ids:
        base = os.path.join(node_dir, f"node{node_id}")
        cpus = tuple(c for c in _parse_list(_read(os.path.join(base, "cpulist")) or "") if c in online_set)
        claimed.update(cpus)
        row = (_read(os.path.join(base, "distance")) or "").split()
        distances = {other: int(d) for other, d in zip(ids, row) if d.isdigit()} if len(row) == len(ids) else {}
        nodes.append(NumaNode(node_id, cpus, distances))
    stray = tuple(c for c in online if c not in claimed)
    if stray:  # an online CPU no node lists (should not happen): count it as the first node's
        first = nodes[0]
        nodes[0] = dataclasses.replace(first, cpus=tuple(sorted(first.cpus + stray)))
    return tuple(nodes)


def read_topology(
    sysfs_root: str = "/sys", *, gpus: bool = True, pcie_switch_size: Optional[int] = 8, nvml: Any = None
) -> Topology:
    """Read CPUs, NUMA nodes and (when ``gpus``) GPUs from ``sysfs_root``.

    Missing per-CPU topology files degrade gracefully (a CPU without
    ``thread_siblings_list`` is its own core; without ``physical_package_id``
    it is on package 0). Raises TopologyError only when no online CPU is found.
    ``nvml`` replaces the ``pynvml`` module (tests); see :func:`read_gpus`,
    also for ``pcie_switch_size`` (None: NVML's PCIe tree).
    """
    cpu_dir = os.path.join(sysfs_root, "devices", "system", "cpu")
    online = _online_cpus(cpu_dir)
    if not online:
        raise TopologyError(f"no online CPU described under {cpu_dir}")
    nodes = _read_nodes(os.path.join(sysfs_root, "devices", "system", "node"), online)
    node_of = {cpu: node.id for node in nodes for cpu in node.cpus}

    listed: Dict[int, Tuple[int, ...]] = {}
    info: Dict[int, Tuple[int, int]] = {}
    for cpu in online:
        topo = os.path.join(cpu_dir, f"cpu{cpu}", "topology")
        siblings = _read(os.path.join(topo, "thread_siblings_list"))
        listed[cpu] = _parse_list(siblings) if siblings else (cpu,)
        info[cpu] = (_read_int(os.path.join(topo, "core_id"), cpu),
                     _read_int(os.path.join(topo, "physical_package_id"), 0))
    groups = _sibling_groups(online, listed)
    cpus = tuple(LogicalCpu(cpu, info[cpu][0], info[cpu][1], node_of[cpu], groups[cpu]) for cpu in online)
    found_gpus = read_gpus(sysfs_root, pcie_switch_size, nvml=nvml) if gpus else ()
    return Topology(cpus=cpus, nodes=nodes, gpus=found_gpus)


#: NVML's topology levels (nvmlGpuTopologyLevel_t): at most this one, two GPUs share a PCIe switch.
_NVML_TOPOLOGY_MULTIPLE = 20


def _switches_from_nvml(nvml: Any, error: Any, count: int) -> Optional[List[int]]:
    """Each GPU's PCIe switch from NVML's tree (numbered in GPU order), or None when NVML cannot say."""
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    group = list(range(count))  # union-find over "shares a switch"

    def root(i: int) -> int:
        while group[i] != i:
            group[i] = group[group[i]]
            i = group[i]
        return i

    try:
        for i in range(count):
            for j in range(i + 1, count):
                level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j]))
                if level <= _NVML_TOPOLOGY_MULTIPLE:
                    group[root(j)] = root(i)
    except (error, AttributeError):  # not supported by this driver or pynvml
        return None
    numbers: Dict[int, int] = {}
    return [numbers.setdefault(root(i), len(numbers)) for i in range(count)]


def _sysfs_bus_id(nvml_bus_id: Any) -> str:
    """NVML's ``00000000:3B:00.0`` (8-digit domain, upper case) -> sysfs's ``0000:3b:00.0``."""
    text = nvml_bus_id.decode() if isinstance(nvml_bus_id, bytes) else str(nvml_bus_id)
    domain, _, rest = text.strip().lower().partition(":")
    return f"{domain[-4:].rjust(4, '0')}:{rest}"


def read_gpus(sysfs_root: str = "/sys", pcie_switch_size: Optional[int] = 8, *, nvml: Any = None
              ) -> Tuple[Gpu, ...]:
    """The GPUs NVML sees, or ``()`` when pynvml is missing or finds no driver/library.

    NUMA node: the PCI device's ``numa_node`` under ``sysfs_root`` (-1, "the
    firmware did not say", counts as node 0). PCIe switch: with a
    ``pcie_switch_size`` (BYTEPS_PCIE_SWITCH_SIZE set), BytePS's rule,
    ``index // size``; with None, the real PCIe tree: GPUs whose closest
    common ancestor (``nvmlDeviceGetTopologyCommonAncestor``) is at most a
    PCIe switch share one, numbered in GPU order; BytePS's rule with 8 when
    NVML cannot say. Read through the real pynvml on one H100 machine
    (docs/gpu.md); the tests pass a fake pynvml module as ``nvml``, with
    answers recorded there among others.
    """
    if nvml is None:
        try:
            import pynvml as nvml  # optional: pip install "byteps-launcher[gpu]" (nvidia-ml-py)
        except ImportError:
            return ()
    error = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except error:  # NVMLError_LibraryNotFound (no driver library), DriverNotLoaded, NoPermission...
        return ()
    found = []
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            bus_id = _sysfs_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId)
            node = _read_int(os.path.join(sysfs_root, "bus", "pci", "devices", bus_id, "numa_node"), -1)
            try:
                uuid = nvml.nvmlDeviceGetUUID(handle)
                uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            except error:
                uuid = ""
            found.append(Gpu(index, bus_id, max(node, 0), index // max(pcie_switch_size or 8, 1), uuid))
        if pcie_switch_size is None and len(found) > 1:
            switches = _switches_from_nvml(nvml, error, len(found))
            if switches is not None:
                found = [dataclasses.replace(gpu, pcie_switch=switch) for gpu, switch in zip(found, switches)]
    except error:  # a GPU that fell off the bus, a driver mismatch: place workers as if there were no GPU
        found = []
    finally:
        try:
            nvml.nvmlShutdown()
        except error:
            pass
    return tuple(found)
