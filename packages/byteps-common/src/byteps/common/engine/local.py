"""Summing inside one machine through shared memory: the COPY_IN, LOCAL_REDUCE and LOCAL_BROADCAST stages.

With BYTEPS_LOCAL_SIZE = L worker processes on a machine, each tensor has
one shared segment of L slots (one per local rank, see
:mod:`byteps.common.shared_segment`). Every partition has a *local root*,
spread over the local ranks partition by partition (BytePS gives the whole
machine's network work to one process). The routes
(:mod:`byteps.common.engine.route`):

* other ranks: COPY_IN (the input into the rank's own slot, LOCAL_READY to
  the root), LOCAL_BROADCAST (wait for the root's LOCAL_DONE; the result is
  the root's slot), COPY_OUT;
* the root: LOCAL_REDUCE (once every other rank is ready, its input and
  their slots summed into its own slot), EXCHANGE of that slot (none with a
  single worker machine: the local sum is the result), LOCAL_BROADCAST
  (LOCAL_DONE to the others), COPY_OUT.

So each partition crosses the network once per machine, not once per
process. Where a rank's input is known to be zero (a gather's partitions
outside its own rows, a broadcast's non-root), it copies nothing and its
LOCAL_READY says so: the root sums only the slots with bytes in them.

A slot is never overwritten while someone still reads it: a rank writes
round r + 1 into its slot only after its round r finished, which the root
signalled after reading that slot; the root sums round r + 1 into its slot
only after every other rank reported round r + 1 ready, i.e. after they
all copied round r out.

Backup workers: a round every local rank skips (``skipping_round()``) is
pulled by the root into its slot once every rank said it is ready (which
it does without copying); the root's LOCAL_DONE carries how many rounds had
closed after it, so every local rank learns what the root learnt.

Control messages go through :class:`~byteps.common.engine.local_channel.LocalChannel`
(authenticated with the job secret). A failure on one local rank is sent
to the others as ERROR, so every rank fails the push_pull instead of
waiting. Joined ranks (Horovod's ``hvd.join()``) are in
:mod:`byteps.common.engine.local_join`.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence, Tuple

from byteps.common import kernels
from byteps.common.engine.device import DeviceSlots, summed_on_gpu
from byteps.common.engine.exchange import partition_spec
from byteps.common.engine.local_channel import LocalChannel
from byteps.common.engine.local_flags import LOCAL_ZEROS, describe_local, local_flags
from byteps.common.engine.local_join import JoinedRanks, StandIns, joined_text
from byteps.common.engine.local_slots import SlotTable, TensorSegment
from byteps.common.engine.route import Stage
from byteps.common.engine.stage import DONE, NOTHING, WAIT, Failure, Later, Outcome, TaskFailed
from byteps.common.engine.task import PartitionTrip, PushPullTask
from byteps.common.partition import PARTITION_INDEX_BITS, Partition
from byteps.common.row_sparse import is_sparse_key
from byteps.common.tensor_description import MISMATCH_ADVICE, TensorDescription
from byteps.transport import (
    Command,
    Context,
    TransportError,
    command_name,
    json_payload,
    parse_json_payload,
)

__all__ = ["LocalGroup"]

log = logging.getLogger("byteps.common.engine.local")


class Ready:
    """One LOCAL_READY: a peer's partition is in its slot (``about``, ``spec``, ``server``: the first round's
    description of the tensor and of this partition's key; ``notice``: the layout a layout notice announces)."""

    __slots__ = ("rank", "nbytes", "dtype", "flags", "about", "spec", "server", "notice")

    def __init__(self, rank: int, nbytes: int, dtype: int, flags: int, fields: Optional[dict]) -> None:
        self.rank, self.nbytes, self.dtype, self.flags = rank, nbytes, dtype, flags
        fields = fields or {}
        self.about = TensorDescription.from_json(fields) if "name" in fields else None
        self.spec, self.server, self.notice = fields.get("spec"), fields.get("server"), fields.get("notice")


class LocalGroup:
    """This process's side of local aggregation: its slots, the channel to its peers, who is ready.

    The engine calls :meth:`prepare` for each task before its trips start,
    polls :attr:`inbox` and hands what arrives to :meth:`receive`, whose
    events it dispatches.
    """

    def __init__(self, context: Context, job_id: str, machine: int, local_rank: int, local_size: int,
                 partition_bytes: int, secret: Optional[bytes] = None, timeout_s: float = 120.0,
                 num_servers: int = 0, quorum: int = 0) -> None:
        self.job_id, self.machine = job_id, machine
        self.local_rank, self.local_size = local_rank, local_size
        self.global_rank = machine * local_size + local_rank
        self.channel = LocalChannel(context, job_id, machine, local_rank, local_size, secret, timeout_s)
        # (tensor id, round) another local rank failed before this rank started it
        self._failed: Dict[Tuple[int, int], BaseException] = {}
        self.segments = SlotTable(job_id, machine, local_size)
        # (key, round) -> LOCAL_READYs; they may arrive before this rank's own task
        self._ready: Dict[Tuple[int, int], List[Ready]] = {}
        # (key, round) -> the trip this process waits on, as root (for READY) or not (for DONE)
        self._waiting: Dict[Tuple[int, int], PartitionTrip] = {}
        self.joins = JoinedRanks(local_rank, local_size)
        self.stand_ins = StandIns(self, partition_bytes, num_servers, quorum)
        self.copied_in = 0  # bytes this rank copied into its slots (COPY_IN)
        self.sums = 0  # slots this rank added into a sum as a root (one per input with bytes, past the first)
        #: GPU-side local aggregation of CUDA tensors: the peers' device slots
        self.device = DeviceSlots(local_rank)
        #: The machine's row-sparse sums (byteps.common.engine.sparse_local), whose messages come here too
        self.sparse: Any = None

    def runners(self):
        return {Stage.COPY_IN: self.copy_in, Stage.LOCAL_REDUCE: self.local_reduce,
                Stage.LOCAL_BROADCAST: self.local_broadcast}

    @property
    def inbox(self):
        return self.channel.inbox

    def root_of(self, tensor_id: int, part: Partition, members: Optional[Tuple[int, ...]] = None) -> int:
        """The local rank that sums ``part`` (one of ``members``, the local ranks taking part; default all)."""
        if members is None:
            return (tensor_id + part.index) % self.local_size
        return members[(tensor_id + part.index) % len(members)]

    def members_of(self, task: PushPullTask) -> Tuple[int, ...]:
        """The local ranks taking part in ``task`` (a process set's may be fewer than all)."""
        if task.members is None:
            return tuple(range(self.local_size))
        return tuple(r % self.local_size for r in task.members if r // self.local_size == self.machine)

    def is_root(self, trip: PartitionTrip) -> bool:
        task = trip.task
        return self.root_of(task.plan.tensor_id, trip.part, self.members_of(task)) == self.local_rank

    # --- a task arrives ----------------------------------------------------------------
    def prepare(self, task: PushPullTask) -> None:
        """Map the task's segment; raises TaskFailed if it cannot take part."""
        failed = self._failed.pop((task.plan.tensor_id, task.round), None)
        if failed is not None:
            raise TaskFailed(failed, tell_peers=False)
        self.stand_ins.remember(task)
        try:
            if summed_on_gpu(task):  # its device slot is the staging's
                self.device.gpu_tensors.add(task.plan.tensor_id)
            else:
                self.segment_of(task.plan.tensor_id, task.plan.nbytes, f"push_pull({task.name!r})")
        except ValueError as exc:
            raise TaskFailed(exc) from None

    def segment_of(self, tensor_id: int, nbytes: int, what: str) -> TensorSegment:
        return self.segments.segment_of(tensor_id, nbytes, what)

    # --- the stages ----------------------------------------------------------------------
    def copy_in(self, trip: PartitionTrip) -> Outcome:
        """COPY_IN: this rank's input into its slot (none where it is zeros), and LOCAL_READY to the root."""
        zeros = _zeros_here(trip)
        if not zeros:
            self.segments[trip.task.plan.tensor_id].slot(self.local_rank, trip.part)[:] = trip.data
            self.copied_in += trip.part.nbytes
        self.send_ready(trip, zeros=zeros)
        return DONE

    def send_ready(self, trip: PartitionTrip, device_slot: Optional[bytes] = None, zeros: bool = False) -> None:
        """LOCAL_READY to the partition's root. The first round's says what the tensor is, as INIT_KEY does to
        a server, and what this partition's key is (so a root that has joined can stand in for it), and,
        summed on the GPU, where this rank's device slot is. ``zeros``: this rank copied nothing."""
        task, part = trip.task, trip.part
        fields = {}
        if task.round == 0:
            fields = _description(task, self.global_rank).to_json()
            fields["spec"], fields["server"] = partition_spec(task, part).to_json(), part.server
            if device_slot is not None:
                fields["device_slot"] = device_slot.hex()
        if task.notice is not None:
            fields["notice"] = task.notice
        about = json_payload(fields) if fields else None
        root = self.root_of(task.plan.tensor_id, part, self.members_of(task))
        flags = local_flags(task) | (LOCAL_ZEROS if zeros else 0)
        self.channel.send(root, Command.LOCAL_READY, part.key, task.round, part.nbytes, int(task.source.dtype),
                          flags, about)

    def local_reduce(self, trip: PartitionTrip) -> Outcome:
        """LOCAL_REDUCE (root): once every other rank is ready, the machine's sum into this rank's slot."""
        entry = (trip.part.key, trip.task.round)
        self._waiting[entry] = trip
        outcome = self._reduce_if_ready(entry)
        return WAIT if outcome is None else outcome

    def local_broadcast(self, trip: PartitionTrip) -> Outcome:
        """LOCAL_BROADCAST: the root tells the others the result is in its slot; they wait for that."""
        task, part = trip.task, trip.part
        members = self.members_of(task)
        if self.root_of(task.plan.tensor_id, part, members) != self.local_rank:
            self._waiting[(part.key, task.round)] = trip
            return WAIT
        # summed on the GPU, the first round tells the others where the root's device slot is
        slot = json_payload({"device_slot": task.device.shared[1].hex()}) \
            if task.round == 0 and summed_on_gpu(task) else None
        # backup workers: how many rounds had closed after this one travels instead of the size
        aux = trip.closed_after if task.quorum and trip.closed_after is not None else part.nbytes
        for rank in members:
            if rank != self.local_rank:
                self.channel.send(rank, Command.LOCAL_DONE, part.key, task.round, aux, int(task.source.dtype),
                                  payload=slot)
        return DONE

    # --- messages from the other local ranks ------------------------------------------------
    def receive(self):
        """One message from a local peer: the events it causes (trips moved on, failures)."""
        message = self.channel.receive()
        if message is None:
            return NOTHING
        if is_sparse_key(message.header.key):  # a row-sparse table's: the machine's sum by id (sparse_local)
            return self.sparse.receive(message)
        header = message.header
        entry = (header.key, header.round)
        command = header.command
        if command == Command.LOCAL_READY:
            fields = parse_json_payload(message.payload) if message.payload is not None else None
            if fields is not None and "name" in fields:
                self.stand_ins.learn(header.key, fields)
                if fields.get("device_slot"):
                    self.device.learn(header.sender, header.key >> PARTITION_INDEX_BITS, fields["device_slot"])
            self.joins.ready_from(header.sender, entry)
            self._ready.setdefault(entry, []).append(Ready(header.sender, header.aux, header.dtype, header.flags,
                                                           fields))
            return self._progress(entry)
        if command == Command.LOCAL_DONE:
            return self._done(message)
        if command == Command.ERROR:
            text = message.text()
            return self._peer_failed(header.key >> PARTITION_INDEX_BITS, header.round,
                                     TransportError(f"local rank {header.sender}: {text}"))
        if command == Command.LOCAL_JOINED:
            self.joins.add(header.sender)
            return self.revisit()
        log.error("unexpected %s from local rank %d", command_name(command), header.sender)
        return NOTHING

    def _done(self, message):
        header = message.header
        if message.payload is not None:
            self.device.learn(header.sender, header.key >> PARTITION_INDEX_BITS,
                              parse_json_payload(message.payload)["device_slot"])
        trip = self._waiting.pop((header.key, header.round), None)
        if trip is None:
            return NOTHING
        task = trip.task
        if summed_on_gpu(task):
            try:
                self.device.result_from(trip, header.sender)
            except TaskFailed as failed:
                return [Failure(task, failed.error)]
        else:
            trip.data = self.segments[task.plan.tensor_id].slot(header.sender, trip.part)
        if task.quorum:
            task.close_rounds_early(header.aux)
        return [trip]

    def _progress(self, entry: Tuple[int, int]):
        """Events after a LOCAL_READY (or a LOCAL_JOINED) for ``entry``: its reduction, or a stand-in's start."""
        trip = self._waiting.get(entry)
        if trip is None:
            if self.joins.joining and self._ready.get(entry):
                return self.stand_ins.start(entry, self._ready)
            return NOTHING
        try:
            outcome = self._reduce_if_ready(entry)
        except TaskFailed as failed:
            return [Failure(trip.task, failed.error, failed.tell_peers)]
        if outcome is None:
            return NOTHING
        return [trip] if outcome is DONE else [Later(trip, outcome)]

    def _reduce_if_ready(self, entry: Tuple[int, int]) -> Optional[Outcome]:
        """The root's sum of ``entry`` once every member is ready (None: not yet); raises TaskFailed."""
        trip = self._waiting.get(entry)
        ready = self._ready.get(entry, [])
        task, part = trip.task, trip.part
        members = self.members_of(task)
        if self.root_of(task.plan.tensor_id, part, members) != self.local_rank:
            return None  # this rank waits for the root's LOCAL_DONE
        absent = self.joins.absent(entry, members, ready)
        if absent is None:
            return None
        del self._waiting[entry]
        self._ready.pop(entry, None)
        if absent and task.tag and task.notice is None:  # a joined rank's zeros agree with a notice
            raise TaskFailed(RuntimeError(joined_text(task.name, absent)))
        self._check_peers(task, part, ready)
        if summed_on_gpu(task):
            return self.device.reduce(trip, [peer.rank for peer in ready])
        segment = self.segments[task.plan.tensor_id]
        slot = segment.slot(self.local_rank, part)
        if not task.skipped:  # a skipped round's sum is pulled into the slot: nothing to add
            # the inputs with bytes in them: a partition of a gather has one, copied; zeros alone leave zeros
            inputs = [] if _zeros_here(trip) else [trip.data]
            inputs += [segment.slot(peer.rank, part) for peer in ready if not peer.flags & LOCAL_ZEROS]
            if inputs:
                slot[:] = inputs[0]
            else:
                slot[:] = 0
            trip.zeros = not inputs  # the servers need only a header for it
            for other in inputs[1:]:
                kernels.sum_into(slot, other, task.source.dtype)
            self.sums += max(0, len(inputs) - 1)
        if task.round == 0 and part.index == 0 and not absent:
            # Every local rank has mapped the segment (they wrote into it): the name can go.
            # (A rank that joined before mapping it opens it later: the name stays until close().)
            segment.segment.unlink()
        trip.data = slot
        return DONE

    def _check_peers(self, task: PushPullTask, part: Partition, ready: Sequence[Ready]) -> None:
        """Every ready peer pushes the same tensor, partition and op as this rank; else TaskFailed."""
        dtype, flags = int(task.source.dtype), local_flags(task)
        for peer in ready:
            if peer.notice != task.notice:
                raise TaskFailed(ValueError(_notice_mismatch(task, (peer.rank, peer.notice),
                                                             (self.local_rank, task.notice))))
            if peer.about is not None and not task.stand_in:  # first round only
                mine = _description(task, self.global_rank)
                if not peer.about.same_tensor(mine):
                    raise TaskFailed(ValueError(
                        f"mismatch for tensor id {task.plan.tensor_id}: worker {peer.about.rank} declares "
                        f"{peer.about.describe()}, worker {self.global_rank} declared {mine.describe()}; "
                        f"{MISMATCH_ADVICE}"))
            if (peer.nbytes, peer.dtype, peer.flags & ~LOCAL_ZEROS) != (part.nbytes, dtype, flags):
                raise TaskFailed(ValueError(
                    f"push_pull({task.name!r}) partition {part.index}: local rank {peer.rank} has "
                    f"{describe_local(peer.nbytes, peer.dtype, peer.flags)}, local rank {self.local_rank} has "
                    f"{describe_local(part.nbytes, dtype, flags)}; every worker must push_pull the same tensors"))

    # --- join ---------------------------------------------------------------------------
    def join(self):
        """This rank joined (after its last LOCAL_READY): tell the others, stand in for them from now on. Returns
        the events of the rounds the others already started (their LOCAL_READYs may be here)."""
        self.joins.start()
        for rank in range(self.local_size):
            if rank != self.local_rank:
                self.channel.send(rank, Command.LOCAL_JOINED, 0, 0)
        return self.revisit()

    def revisit(self):
        """Rounds that waited for a rank that has joined since: complete them with its zeros."""
        events = []
        for entry in list(self._waiting):
            events.extend(self._progress(entry))
        for entry in list(self._ready):
            if entry not in self._waiting:
                events.extend(self._progress(entry))
        if self.sparse is not None:  # row-sparse tables' sums, and the stand-ins of a joined root
            events.extend(self.sparse.revisit())
        return events

    # --- failures ----------------------------------------------------------------------
    def _peer_failed(self, tensor_id: int, round_: int, error: BaseException):
        tasks = {trip.task for (key, r), trip in self._waiting.items()
                 if key >> PARTITION_INDEX_BITS == tensor_id and r == round_}
        if not tasks:
            self._failed[(tensor_id, round_)] = error
        return [Failure(task, error, tell_peers=False) for task in tasks]

    def abandon(self, task: PushPullTask) -> None:
        for part in task.plan.partitions:
            self._waiting.pop((part.key, task.round), None)

    def tell_peers(self, task: PushPullTask, error: BaseException) -> None:
        """Fail this push_pull on the other local ranks too (they may be waiting on us)."""
        key = task.plan.tensor_id << PARTITION_INDEX_BITS
        for rank in self.members_of(task):
            if rank != self.local_rank:
                self.channel.send(rank, Command.ERROR, key, task.round, payload=str(error).encode())

    def send_error(self, ranks: Sequence[int], key: int, round_: int, text: str) -> None:
        for rank in ranks:
            self.channel.send(rank, Command.ERROR, key, round_, payload=text.encode())

    def close(self) -> None:
        self.channel.close()
        self.segments.close()


def _notice_mismatch(task: PushPullTask, *ranks: Tuple[int, Optional[str]]) -> str:
    """The error of a round where local ranks disagree on a name's layout: who uses which."""
    uses = [f"local rank {rank} " + (f"now uses it with layout {notice}" if notice is not None else
                                     "uses it as before") for rank, notice in ranks]
    return (f"push_pull({task.name!r}): the ranks use this name with different shapes or dtypes: "
            f"{'; '.join(uses)}; every rank must pass the same shape and dtype under a name")


def _zeros_here(trip: PartitionTrip) -> bool:
    """Whether this rank's input is all zeros in the trip's partition (asked on the host route only: COPY_IN
    and the root's sum): outside its nonzero bytes, or a skipped round's."""
    return trip.task.skipped or trip.part.outside(trip.task.nonzero)


def _description(task: PushPullTask, rank: int) -> TensorDescription:
    return TensorDescription(task.name, tuple(task.source.shape), task.plan.nbytes, int(task.source.dtype), rank,
                             summed_on_gpu(task))

