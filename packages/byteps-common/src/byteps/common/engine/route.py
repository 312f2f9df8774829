"""Every route a partition can take, listed once, as data.

A push_pull is cut into partitions; each partition travels a route of
:class:`Stage`\\ s, chosen by :func:`plan_route` from four facts: the
partition's *role* on this machine (the only process, the local root that
sums it, another local rank, or a joined local root standing in for the
ranks still running), whether servers take part, whether it is compressed,
and where the tensor lives (host memory, a CUDA tensor staged through
pinned memory, or a CUDA tensor summed on the GPU by the machine's
processes). :data:`ROUTES` holds every valid combination; docs/architecture.md
prints :func:`route_table` and a test keeps the two equal.

A route also says where the servers' sum lands (:class:`Landing`): in the
task's output when COPY_OUT follows the network part, else in place, in the
buffer the partition's bytes were in (the local root's slot).
"""

from __future__ import annotations

import enum
import itertools
from typing import Dict, List, NamedTuple, Optional, Tuple

__all__ = ["Stage", "Role", "Placement", "Landing", "Route", "ROUTES", "SPARSE_ROUTE", "SPARSE_ROUTES", "plan_route",
           "route_table", "sparse_route"]


class Stage(enum.Enum):
    """One step of a partition's route."""

    DEVICE_TO_HOST = "device_to_host"  # a CUDA tensor: the partition's copy into pinned host memory is done
    COPY_IN = "copy_in"  # a non-root local rank: input into its shared slot, LOCAL_READY to the root
    LOCAL_REDUCE = "local_reduce"  # the local root: every local rank's input summed into its slot
    COMPRESS = "compress"  # the pushing process: momentum, error feedback, the codec (the data becomes the payload)
    EXCHANGE = "exchange"  # push to the partition's server, the round's sum back (a skipped round: pull only)
    DECOMPRESS = "decompress"  # the server's compressed sum into the partition's dense buffer
    LOCAL_BROADCAST = "local_broadcast"  # root: LOCAL_DONE to the others; the others: wait for it
    COPY_OUT = "copy_out"  # the result into the task's output, divided when averaging
    HOST_TO_DEVICE = "host_to_device"  # a CUDA tensor: the partition's result queued back to the device
    # GPU-side local aggregation (byteps.common.engine.device); LOCAL_REDUCE then sums on the GPU
    DEVICE_COPY_IN = "device_copy_in"  # the input is in this rank's device slot; LOCAL_READY to the root
    DEVICE_RESULT = "device_result"  # root: the pulled sum (averaged) into its device slot
    DEVICE_COPY_OUT = "device_copy_out"  # the root's device slot into the output (after the last: handed over)
    # A row-sparse push_pull's share of one server (byteps.common.engine.sparse_exchange; docs/sparse.md)
    SPARSE_EXCHANGE = "sparse_exchange"  # its (id, row) records to the server, the round's union of them back
    SPARSE_MERGE = "sparse_merge"  # the servers' unions merged into the result (after the last), averaged
    # Several worker processes per machine (byteps.common.engine.sparse_local): the table's local root sums them
    SPARSE_TO_ROOT = "sparse_to_root"  # another local rank: its rows to the local root, the round's result back
    SPARSE_LOCAL_SUM = "sparse_local_sum"  # the local root: every local rank's rows summed by id, cut by server
    SPARSE_LOCAL_ANSWER = "sparse_local_answer"  # the local root: the round's result to the other local ranks


class Role(enum.Enum):
    """What this process does for a partition."""

    ALONE = "one process per machine"
    ROOT = "local root"
    PEER = "another local rank"
    STAND_IN = "joined local root, for the ranks still running"


class Placement(enum.Enum):
    """Where the tensor lives."""

    HOST = "host memory"
    STAGED = "CUDA, staged through pinned memory"
    GPU_LOCAL = "CUDA, summed on the GPU inside the machine"


class Landing(enum.Enum):
    """Where the servers' sum of a partition ends up."""

    OUTPUT = "output"  # the task's output (COPY_OUT follows the network part)
    IN_PLACE = "in place"  # the buffer the partition's bytes were in (the local root's slot)


class Route(NamedTuple):
    """One route: the facts it was chosen by, its stages and where the servers' sum lands."""

    role: Role
    servers: bool
    compressed: bool
    placement: Placement
    stages: Tuple[Stage, ...]
    landing: Optional[Landing]  # None: no servers take part

    def describe(self) -> str:
        facts = [self.role.value]
        if self.role is not Role.PEER:  # another rank's stages are the same with servers or without
            facts.append("servers" if self.servers else "no servers")
        if self.compressed:
            facts.append("compressed")
        if self.placement is not Placement.HOST:
            facts.append(self.placement.value)
        return ", ".join(facts)


def _stages(role: Role, servers: bool, compressed: bool, placement: Placement) -> Optional[Tuple[Stage, ...]]:
    """The stages of a combination, or None where it cannot occur."""
    if compressed and (not servers or placement is Placement.GPU_LOCAL):
        return None  # compression is for the servers' wire; GPU local sums are uncompressed
    if placement is Placement.GPU_LOCAL:
        if role is Role.ROOT:
            network = (Stage.EXCHANGE, Stage.DEVICE_RESULT) if servers else ()
            return (Stage.DEVICE_COPY_IN, Stage.LOCAL_REDUCE, *network, Stage.LOCAL_BROADCAST, Stage.DEVICE_COPY_OUT)
        if role is Role.PEER:
            return (Stage.DEVICE_COPY_IN, Stage.LOCAL_BROADCAST, Stage.DEVICE_COPY_OUT)
        return None
    network: Tuple[Stage, ...] = ()
    if servers:
        network = (Stage.COMPRESS, Stage.EXCHANGE, Stage.DECOMPRESS) if compressed else (Stage.EXCHANGE,)
    if role is Role.ALONE:
        host = (*network, Stage.COPY_OUT)
    elif role is Role.ROOT:
        host = (Stage.LOCAL_REDUCE, *network, Stage.LOCAL_BROADCAST, Stage.COPY_OUT)
    elif role is Role.PEER:
        host = (Stage.COPY_IN, Stage.LOCAL_BROADCAST, Stage.COPY_OUT)
    else:  # a stand-in has no input and no output of its own: the slot is the result
        if placement is not Placement.HOST:
            return None
        host = (Stage.LOCAL_REDUCE, *network, Stage.LOCAL_BROADCAST)
    if placement is Placement.STAGED:
        return (Stage.DEVICE_TO_HOST, *host, Stage.HOST_TO_DEVICE)
    return host


def _landing(role: Role, servers: bool, placement: Placement) -> Optional[Landing]:
    if not servers or role is Role.PEER:
        return None
    return Landing.OUTPUT if role is Role.ALONE else Landing.IN_PLACE


def _key(role: Role, servers: bool, compressed: bool, placement: Placement) -> Tuple:
    if role is Role.PEER:  # another local rank's stages depend on where the tensor lives only
        return role, False, False, placement
    return role, servers, compressed, placement


def _build() -> Dict[Tuple, Route]:
    routes = {}
    for role, servers, compressed, placement in itertools.product(Role, (True, False), (False, True), Placement):
        stages = _stages(role, servers, compressed, placement)
        key = _key(role, servers, compressed, placement)
        if stages is not None and key not in routes:
            routes[key] = Route(*key, stages, _landing(*key[:2], placement))
    return routes


#: Every route a partition can take, by (role, servers, compressed, placement).
ROUTES: Dict[Tuple, Route] = _build()


#: The route of a row-sparse push_pull's share of one server (one process per machine, servers). Not in
#: :data:`ROUTES`, which holds the routes of a dense tensor's partitions: a sparse share is no window of the
#: caller's tensor and its answer's size is known only when it arrives (docs/sparse.md).
SPARSE_ROUTE = Route(Role.ALONE, True, False, Placement.HOST, (Stage.SPARSE_EXCHANGE, Stage.SPARSE_MERGE),
                     Landing.OUTPUT)

_SPARSE_PEER_ROUTE = Route(Role.PEER, False, False, Placement.HOST, (Stage.SPARSE_TO_ROOT,), None)

#: Every route of a row-sparse push_pull's trip, by (role, servers): a lone process's share of one server; a
#: local root's share of one server (after the machine's sum), or its one trip without servers (the machine's
#: sum is the result); another local rank's one trip, which its root does the rest for.
SPARSE_ROUTES: Dict[Tuple[Role, bool], Route] = {
    (Role.ALONE, True): SPARSE_ROUTE,
    (Role.ROOT, True): Route(Role.ROOT, True, False, Placement.HOST,
                             (Stage.SPARSE_LOCAL_SUM, Stage.SPARSE_EXCHANGE, Stage.SPARSE_MERGE,
                              Stage.SPARSE_LOCAL_ANSWER), Landing.OUTPUT),
    (Role.ROOT, False): Route(Role.ROOT, False, False, Placement.HOST,
                              (Stage.SPARSE_LOCAL_SUM, Stage.SPARSE_LOCAL_ANSWER), None),
    (Role.PEER, True): _SPARSE_PEER_ROUTE,  # the same with servers or without: the root does the network part
    (Role.PEER, False): _SPARSE_PEER_ROUTE,
}


def sparse_route(role: Role, servers: bool) -> Route:
    """The route of a row-sparse trip; ValueError for a combination that cannot occur (a lone process
    without servers makes its result at the call)."""
    route = SPARSE_ROUTES.get((role, servers))
    if route is None:
        raise ValueError(f"no row-sparse route for a {role.value} with{'' if servers else 'out'} servers")
    return route


def plan_route(role: Role, servers: bool, compressed: bool = False, placement: Placement = Placement.HOST) -> Route:
    """The route of a partition; ValueError for a combination that cannot occur."""
    route = ROUTES.get(_key(role, servers, compressed, placement))
    if route is None:
        raise ValueError(f"no route for a {role.value} with{'' if servers else 'out'} servers"
                         f"{', compressed' if compressed else ''}, {placement.value}")
    return route


def route_table() -> str:
    """Every route as the rows of a markdown table (what docs/architecture.md shows)."""
    lines: List[str] = ["| partition | stages |", "|---|---|"]
    for route in ROUTES.values():
        lines.append(f"| {route.describe()} | {', '.join(stage.name for stage in route.stages)} |")
    return "\n".join(lines)
