"""Joined local ranks (Horovod's ``hvd.join()``) inside one machine: counted as zeros, and standing in.

A local rank out of data sends LOCAL_JOINED after its last LOCAL_READY.
From then on:

* a root counts a joined rank missing from a round as zeros
  (:meth:`JoinedRanks.absent`);
* a joined rank that roots a partition still sums it for the ranks still
  running: for each round it never started, a *stand-in* task (its own
  input zeros, its slot the result) takes the route LOCAL_REDUCE, EXCHANGE
  (with servers: the machine's sum goes to the partition's server like any
  push), LOCAL_BROADCAST. It knows the partition from its own earlier rounds
  of the tensor, or, for a tensor first used after it joined, from the
  first round's LOCAL_READY, which describes the partition's key and server.

A LOCAL_READY from a rank that joined comes after every rank joined (join
returns only then): such a round is a new one and waits for everybody.
Only sums count a joined rank as zeros: a gather or a broadcast fails on
every rank, as Horovod's do.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, NamedTuple, Optional, Sequence, Set, Tuple

from byteps.common.buffers import TensorView
from byteps.common.dtypes import DType
from byteps.common.engine.local_flags import SKIPPED_TAG, TAG_BITS, describe_local
from byteps.common.engine.route import Role, plan_route
from byteps.common.engine.stage import RoundRefused
from byteps.common.engine.task import PartitionTrip, PushPullTask
from byteps.common.handle import Handle
from byteps.common.options import PushPullOptions
from byteps.common.partition import MAX_PARTITIONS, PARTITION_INDEX_BITS, PartitionPlan
from byteps.common.tensor_description import notice_tag
from byteps.transport import FLAG_AVERAGE

__all__ = ["JoinedRanks", "StandIns", "joined_text"]


def joined_text(what: str, joined: Sequence[int]) -> str:
    return (f"{what}: local rank(s) {', '.join(map(str, joined))} joined (hvd.join()); only allreduces count "
            "a joined rank as zeros: allgather, broadcast and the other collectives need every rank")


class JoinedRanks:
    """Which local ranks joined, and which rounds started after every rank had."""

    def __init__(self, local_rank: int, local_size: int) -> None:
        self.local_rank, self.local_size = local_rank, local_size
        self.joining = False  # this rank joined
        self.joined: Set[int] = set()  # the local ranks that joined, this one included once it did
        # rounds started after every rank joined (a joined rank sent a LOCAL_READY for them): nobody is zeros
        self.after_join: Set[Tuple[int, int]] = set()

    def start(self) -> None:
        self.joining = True
        self.joined.add(self.local_rank)

    def add(self, rank: int) -> None:
        self.joined.add(rank)

    def ready_from(self, rank: int, entry: Tuple[int, int]) -> None:
        if rank in self.joined:
            self.after_join.add(entry)

    @property
    def all_joined(self) -> bool:
        """Every local rank's LOCAL_JOINED is in, so every round started before it is complete."""
        return len(self.joined) == self.local_size

    def end(self) -> None:
        self.joining = False
        self.joined.clear()
        self.after_join.clear()

    def absent(self, entry: Tuple[int, int], members: Sequence[int], ready: Sequence[Any]) -> Optional[tuple]:
        """The members counted as zeros in ``entry`` (joined ranks that sent nothing), or None to wait on."""
        have = {peer.rank for peer in ready}
        have.add(self.local_rank)
        missing = tuple(rank for rank in members if rank not in have)
        if missing and (entry in self.after_join or any(rank not in self.joined for rank in missing)):
            return None
        return missing


class StandIns:
    """What a joined root needs to stand in for its peers, and the stand-in tasks it starts.

    ``group`` is the machine's LocalGroup; ``quorum`` the job's backup-workers quorum (0: none).
    """

    def __init__(self, group: Any, partition_bytes: int, num_servers: int, quorum: int) -> None:
        self._group = group
        self._partition_bytes, self._num_servers, self._quorum = partition_bytes, num_servers, quorum
        self._last: Dict[int, _Remembered] = {}  # tensor id -> what this rank's last task of it was
        self._about: Dict[int, dict] = {}  # tensor id -> a peer's first-round description of it
        self._keys: Dict[int, Tuple[dict, int]] = {}  # key -> (its PartitionSpec fields, its server)

    def remember(self, task: PushPullTask) -> None:
        if not task.stand_in:
            self._last[task.plan.tensor_id] = _Remembered(task.name, tuple(task.source.shape), task.plan,
                                                          task.machines, task.compression, task.lr, task.quorum,
                                                          task.average_over)

    def learn(self, key: int, fields: dict) -> None:
        """A peer's first-round LOCAL_READY: the tensor and this partition's key."""
        self._about.setdefault(key >> PARTITION_INDEX_BITS, fields)
        if fields.get("spec") is not None:
            self._keys.setdefault(key, (fields["spec"], int(fields.get("server") or 0)))

    def start(self, entry: Tuple[int, int], ready_table: Dict[Tuple[int, int], list]):
        """Events for a round this joined rank roots and never started: a stand-in trip once every rank
        still running is ready, or nothing (its peers told why when it cannot stand in)."""
        group = self._group
        ready = ready_table[entry]
        if entry in group.joins.after_join or group.joins.absent(entry, range(group.local_size), ready) is None:
            return ()
        refusal = self._refusal(entry, ready)
        if refusal is not None:
            del ready_table[entry]
            group.send_error([peer.rank for peer in ready], entry[0], entry[1], refusal)
            # The other machines wait for this machine's push of the round, which this rank would make: their
            # server must fail the round too (as a running root's failed task has it do).
            server = self._server_of(entry[0])
            return () if server is None else [RoundRefused(entry[0], entry[1], server, RuntimeError(refusal))]
        return [StandIn(self._trip(entry, ready))]

    def _server_of(self, key: int) -> Optional[int]:
        """The server of ``key`` as this rank's earlier rounds or a peer's first round told it; None without
        servers, or when neither did."""
        if not self._num_servers:
            return None
        last = self._last.get(key >> PARTITION_INDEX_BITS)
        if last is not None:
            return last.plan.partitions[key & (MAX_PARTITIONS - 1)].server
        known = self._keys.get(key)
        return None if known is None else known[1]

    def _refusal(self, entry: Tuple[int, int], ready: Sequence[Any]) -> Optional[str]:
        key, round_ = entry
        tensor_id, index = key >> PARTITION_INDEX_BITS, key & (MAX_PARTITIONS - 1)
        first = ready[0]
        if any((peer.nbytes, peer.dtype, peer.flags & TAG_BITS | peer.flags & FLAG_AVERAGE, peer.notice) !=
               (first.nbytes, first.dtype, first.flags & TAG_BITS | first.flags & FLAG_AVERAGE, first.notice)
               for peer in ready):
            return (f"tensor id {tensor_id} partition {index} round {round_}: local ranks disagree "
                    f"({', '.join(f'{p.rank}: {describe_local(p.nbytes, p.dtype, p.flags)}' for p in ready)})")
        tag = (first.flags & TAG_BITS) >> 1
        if tag and tag != SKIPPED_TAG:
            return joined_text(f"tensor id {tensor_id}", (self._group.local_rank,))
        last, about = self._last.get(tensor_id), self._about.get(tensor_id)
        if last is None and (about is None or (self._num_servers and key not in self._keys)):
            return (f"tensor id {tensor_id}: local rank {self._group.local_rank} joined before the tensor's first "
                    "round reached it, and cannot sum it")
        if tensor_id in self._group.device.gpu_tensors:
            return (f"tensor id {tensor_id}: local rank {self._group.local_rank} joined (hvd.join()); a CUDA tensor "
                    "summed on the GPU cannot count a joined rank as zeros: set BYTEPS_GPU_LOCAL_AGGREGATION=0")
        if last is None and self._num_servers and self._keys[key][0].get("compression"):
            return (f"tensor id {tensor_id}: local rank {self._group.local_rank} joined before this compressed "
                    "tensor's first round, and has no compression state to stand in with")
        return None

    def _trip(self, entry: Tuple[int, int], ready: Sequence[Any]) -> PartitionTrip:
        key, round_ = entry
        tensor_id, index = key >> PARTITION_INDEX_BITS, key & (MAX_PARTITIONS - 1)
        first, group = ready[0], self._group
        dtype = DType(first.dtype)
        last = self._last.get(tensor_id)
        if last is not None:
            name, shape, nbytes = last.name, last.shape, last.plan.nbytes
            part = last.plan.partitions[index]
            machines, compression, lr = last.machines, last.compression, last.lr
            quorum, average_over = last.quorum, last.average_over
        else:
            about = self._about[tensor_id]
            name, shape, nbytes = about["name"], tuple(about.get("shape") or ()), int(about["nbytes"])
            spec, server = self._keys.get(key, ({}, 0))
            plan = PartitionPlan.build(tensor_id, nbytes, dtype.itemsize, self._partition_bytes,
                                       max(1, self._num_servers), lambda _key, _size: 0)
            part = dataclasses.replace(plan.partitions[index], server=server)
            machines, compression, lr = int(spec.get("contributors", 0)), None, None
            quorum, average_over = int(spec.get("quorum", 0)), 1
        average = bool(first.flags & FLAG_AVERAGE)
        own = group.segment_of(tensor_id, nbytes, f"tensor id {tensor_id}").whole(group.local_rank)
        view = TensorView(array=own.view(dtype.storage).reshape(shape), data=own, dtype=dtype)
        notice = first.notice  # a layout notice the others push: the machine's push carries it too
        task = PushPullTask(name=name, round=round_, source=view, output=view,
                            plan=PartitionPlan(tensor_id, nbytes, (part,)), handle=Handle(name, None),
                            options=PushPullOptions(average=average, lr=lr, notice=notice),
                            tag=notice_tag(notice) if notice is not None else 0, average_over=average_over,
                            machines=machines, compression=compression, quorum=quorum if average else 0,
                            skipped=(first.flags & TAG_BITS) >> 1 == SKIPPED_TAG, nonzero=(0, 0), stand_in=True)
        servers = bool(self._num_servers) and task.spans_machines()
        route = plan_route(Role.STAND_IN, servers, servers and compression is not None)
        return PartitionTrip(task, part, route)


class _Remembered(NamedTuple):
    """What a stand-in needs of this rank's last task of a tensor (not the task: that would keep its tensors)."""

    name: str
    shape: Tuple[int, ...]
    plan: PartitionPlan
    machines: int
    compression: Any  # the TensorCompressor, whose error-feedback state the stand-in continues
    lr: Optional[float]
    quorum: int
    average_over: int


class StandIn:
    """An event: start a stand-in task's one trip."""

    __slots__ = ("trip",)

    def __init__(self, trip: PartitionTrip) -> None:
        self.trip = trip

    def deliver(self, dispatcher: Any) -> None:
        dispatcher.tasks.add(self.trip.task, [self.trip])
        dispatcher.advance(self.trip)
