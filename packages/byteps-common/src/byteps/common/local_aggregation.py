"""Summing inside one machine through shared memory: the COPY_IN, LOCAL_REDUCE and LOCAL_BROADCAST stages.

With BYTEPS_LOCAL_SIZE = L worker processes on a machine, each tensor has
one shared segment of L slots (one per local rank, see
:mod:`byteps.common.shared_segment`). Every partition has a *local root*,
spread over the local ranks partition by partition (BytePS gives the whole
machine's network work to one process). Its route (:mod:`byteps.common.route`):

* other ranks: COPY_IN (the input into the rank's own slot, LOCAL_READY to
  the root), LOCAL_BROADCAST (wait for the root's LOCAL_DONE; the result is
  the root's slot), COPY_OUT;
* the root: LOCAL_REDUCE (once every other rank is ready, its input and
  their slots summed into its own slot), PUSH and PULL of that slot (none
  with a single worker machine: the local sum is the result),
  LOCAL_BROADCAST (LOCAL_DONE to the others), COPY_OUT.

So each partition crosses the network once per machine, not once per
process. Where a rank's input is known to be zero (a gather's partitions
outside its own rows, a broadcast's non-root), it copies nothing and its
LOCAL_READY says so: the root sums only the slots with bytes in them, so a
gather's partition costs one copy on the machine instead of L - 1 sums.

A slot is never overwritten while someone still reads it: a rank writes
round r + 1 into its slot only after its round r finished, which
the root signalled after reading that slot; the root sums round r + 1 into
its slot only after every other rank reported round r + 1 ready, i.e.
after they all copied round r out.

Control messages go through :class:`~byteps.common.local_channel.LocalChannel`
(authenticated with the job secret). A failure on one local rank (a size
or dtype that differs, an error from a server) is sent to the others as
ERROR, so every rank fails the push_pull instead of waiting.

Join (Horovod's ``hvd.join()``, on a machine without servers): a rank out
of data sends LOCAL_JOINED after its last LOCAL_READY. A root then counts
a joined rank missing from a round as zeros, and a joined rank that roots
a partition sums the others' slots for rounds it never started (its own
contribution zero) and answers LOCAL_DONE. A LOCAL_READY from a rank that
joined comes after every rank joined (join returns only then): such a
round is a new one and waits for everybody.

A CUDA tensor sums on the GPU instead (:mod:`byteps.common.device_local`):
the same messages, roots and checks, over device slots shared through CUDA
IPC rather than this module's host segments.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from byteps.common import kernels
from byteps.common.device_local import DeviceLocal, summed_on_gpu
from byteps.common.dtypes import DType
from byteps.common.local_channel import LocalChannel
from byteps.common.partition import MAX_PARTITIONS, PARTITION_INDEX_BITS, Partition, PartitionPlan
from byteps.common.route import PartitionTrip
from byteps.common.shared_segment import SharedSegment, segment_name
from byteps.common.tensor_description import MISMATCH_ADVICE, TensorDescription, describe_op, dtype_name
from byteps.transport import (
    FLAG_AVERAGE,
    Command,
    Context,
    TransportError,
    command_name,
    json_payload,
    parse_json_payload,
)

__all__ = ["LocalGroup"]

log = logging.getLogger("byteps.common.local_aggregation")
_ALIGN = 64
#: LOCAL_READY flag: this rank's input is all zeros in the partition (outside the task's ``nonzero`` bytes,
#: e.g. a gather's other ranks' rows) and was not copied into its slot; the root leaves it out of the sum
_LOCAL_ZEROS = 0x80
#: the flag bits that carry the task's tag (see _flags)
_TAG_BITS = 0x7E


def _slot_bytes(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


class _TensorSegment:
    """One tensor's segment, cut into L slots."""

    def __init__(self, segment: SharedSegment, nbytes: int) -> None:
        self.segment = segment
        self.nbytes = nbytes
        self.stride = _slot_bytes(nbytes)
        self.array = np.frombuffer(segment.view, dtype=np.uint8)

    def slot(self, rank: int, part: Partition) -> np.ndarray:
        start = rank * self.stride + part.offset
        return self.array[start:start + part.nbytes]


class _Ready:
    """One LOCAL_READY: a peer's partition is in its slot."""

    def __init__(self, rank: int, nbytes: int, dtype: int, flags: int, about: Optional[TensorDescription]):
        self.rank, self.nbytes, self.dtype, self.flags, self.about = rank, nbytes, dtype, flags, about


class LocalGroup:
    """This process's side of local aggregation: its slots, the channel to its peers, who is ready.

    The owner (the comm thread) calls :meth:`prepare` for each task before
    its trips start, registers the three stage handlers, polls
    :attr:`inbox` and hands what arrives to :meth:`receive`.
    ``proceed(trip)`` moves a trip to its next stage; ``fail_task(task,
    error, tell_peers)`` fails a whole push_pull.
    """

    def __init__(self, context: Context, job_id: str, machine: int, local_rank: int, local_size: int,
                 proceed: Callable[[PartitionTrip], None], fail_task: Callable,
                 secret: Optional[bytes] = None, timeout_s: float = 120.0, partition_bytes: int = 4096000,
                 post_device: Optional[Callable[[PartitionTrip, Any], None]] = None) -> None:
        self.job_id, self.machine = job_id, machine
        self.local_rank, self.local_size = local_rank, local_size
        self.global_rank = machine * local_size + local_rank
        self._proceed, self._fail_task = proceed, fail_task
        self.channel = LocalChannel(context, job_id, machine, local_rank, local_size, secret, timeout_s)
        # (tensor id, round) another local rank failed before this rank started it
        self._failed: Dict[Tuple[int, int], BaseException] = {}
        self._segments: Dict[int, _TensorSegment] = {}
        # (key, round) -> LOCAL_READYs; they may arrive before this rank's own task
        self._ready: Dict[Tuple[int, int], List[_Ready]] = {}
        # (key, round) -> the trip this process waits on, as root (for READY) or not (for DONE)
        self._waiting: Dict[Tuple[int, int], PartitionTrip] = {}
        # join: the local ranks that joined (this one included once it did), and the rounds started after
        # every rank joined (a joined rank sent a LOCAL_READY for them), in which nobody counts as zeros
        self.partition_bytes = partition_bytes
        self.joining = False
        self._joined: Set[int] = set()
        self._after_join: Set[Tuple[int, int]] = set()
        self._sizes: Dict[int, int] = {}  # tensor id -> nbytes, from first-round descriptions
        self.copied_in = 0  # bytes this rank copied into its slots (COPY_IN)
        self.sums = 0  # slots this rank added into a sum as a root (one per input with bytes, past the first)
        #: GPU-side local aggregation of CUDA tensors; ``post_device(trip, event)`` moves a trip on once the
        #: GPU passed ``event``
        self.device = DeviceLocal(local_rank, proceed, post_device, self._send_ready,
                                  lambda task, part: self.root_of(task.plan.tensor_id, part, self.members_of(task)))

    @property
    def inbox(self):
        return self.channel.inbox

    def root_of(self, tensor_id: int, part: Partition, members: Optional[Tuple[int, ...]] = None) -> int:
        """The local rank that sums ``part`` (one of ``members``, the local ranks taking part; default all)."""
        if members is None:
            return (tensor_id + part.index) % self.local_size
        return members[(tensor_id + part.index) % len(members)]

    def members_of(self, task) -> Tuple[int, ...]:
        """The local ranks taking part in ``task`` (a process set's may be fewer than all)."""
        if task.members is None:
            return tuple(range(self.local_size))
        return tuple(r % self.local_size for r in task.members if r // self.local_size == self.machine)

    # --- a task arrives ----------------------------------------------------------------
    def prepare(self, task) -> bool:
        """Map the task's segment; False (the task failed) if it cannot take part."""
        failed = self._failed.pop((task.plan.tensor_id, task.round), None)
        if failed is not None:
            self._fail_task(task, failed, False)
            return False
        try:
            if summed_on_gpu(task):  # its device slot is the staging's
                self.device.gpu_tensors.add(task.plan.tensor_id)
            else:
                self._segment_for(task)
        except ValueError as exc:
            self._fail_task(task, exc, True)
            return False
        return True

    def _segment_for(self, task) -> _TensorSegment:
        return self._segment_of(task.plan.tensor_id, task.plan.nbytes, f"push_pull({task.name!r})")

    def _segment_of(self, tensor_id: int, nbytes: int, what: str) -> _TensorSegment:
        segment = self._segments.get(tensor_id)
        if segment is not None and segment.nbytes != nbytes:
            raise ValueError(f"{what}: {nbytes} bytes, but earlier rounds had {segment.nbytes}; "
                             "a tensor keeps its size for the whole job")
        if segment is None:
            name = segment_name(self.job_id, self.machine, tensor_id)
            shared = SharedSegment.open_or_create(name, self.local_size * _slot_bytes(nbytes))
            segment = self._segments[tensor_id] = _TensorSegment(shared, nbytes)
        return segment

    # --- the stages ----------------------------------------------------------------------
    def copy_in(self, trip: PartitionTrip) -> None:
        """COPY_IN: this rank's input into its slot (none where it is zeros), and LOCAL_READY to the root."""
        zeros = _zeros_here(trip)
        if not zeros:
            self._segments[trip.task.plan.tensor_id].slot(self.local_rank, trip.part)[:] = trip.data
            self.copied_in += trip.part.nbytes
        self._send_ready(trip, zeros=zeros)
        self._proceed(trip)

    def _send_ready(self, trip: PartitionTrip, device_slot: Optional[bytes] = None, zeros: bool = False) -> None:
        """LOCAL_READY to the partition's root; the first round's says what the tensor is, as INIT_KEY does to
        a server (and, summed on the GPU, where this rank's device slot is). ``zeros``: this rank copied
        nothing, its input being zeros there (never on the GPU route, whose DEVICE_COPY_IN copies it all)."""
        task, part = trip.task, trip.part
        about = None
        if task.round == 0:
            fields = _description(task, self.global_rank).to_json()
            if device_slot is not None:
                fields["device_slot"] = device_slot.hex()
            about = json_payload(fields)
        root = self.root_of(task.plan.tensor_id, part, self.members_of(task))
        flags = _flags(task) | (_LOCAL_ZEROS if zeros else 0)
        self.channel.send(root, Command.LOCAL_READY, part.key, task.round, part.nbytes, int(task.source.dtype),
                          flags, about)

    def local_reduce(self, trip: PartitionTrip) -> None:
        """LOCAL_REDUCE (root): once every other rank is ready, the machine's sum into this rank's slot."""
        entry = (trip.part.key, trip.task.round)
        self._waiting[entry] = trip
        self._maybe_reduce(entry)

    def local_broadcast(self, trip: PartitionTrip) -> None:
        """LOCAL_BROADCAST: the root tells the others the result is in its slot; they wait for that."""
        task, part = trip.task, trip.part
        members = self.members_of(task)
        if self.root_of(task.plan.tensor_id, part, members) != self.local_rank:
            self._waiting[(part.key, task.round)] = trip
            return
        # summed on the GPU, the first round tells the others where the root's device slot is
        slot = json_payload({"device_slot": task.device.shared[1].hex()}) \
            if task.round == 0 and summed_on_gpu(task) else None
        for rank in members:
            if rank == self.local_rank:
                continue
            self.channel.send(rank, Command.LOCAL_DONE, part.key, task.round, part.nbytes, int(task.source.dtype),
                              payload=slot)
        self._proceed(trip)

    # --- messages from the other local ranks ------------------------------------------------
    def receive(self) -> None:
        message = self.channel.receive()
        if message is None:
            return
        header = message.header
        entry = (header.key, header.round)
        if header.command == Command.LOCAL_READY:
            fields = parse_json_payload(message.payload) if message.payload is not None else None
            about = TensorDescription.from_json(fields) if fields is not None else None
            if about is not None:
                self._sizes[header.key >> PARTITION_INDEX_BITS] = about.nbytes
                if fields.get("device_slot"):
                    self.device.learn(header.sender, header.key >> PARTITION_INDEX_BITS, fields["device_slot"])
            if header.sender in self._joined:
                self._after_join.add(entry)
            self._ready.setdefault(entry, []).append(
                _Ready(header.sender, header.aux, header.dtype, header.flags, about))
            self._maybe_reduce(entry)
        elif header.command == Command.LOCAL_DONE:
            if message.payload is not None:
                self.device.learn(header.sender, header.key >> PARTITION_INDEX_BITS,
                                  parse_json_payload(message.payload)["device_slot"])
            trip = self._waiting.pop(entry, None)
            if trip is None:
                return
            if summed_on_gpu(trip.task):
                try:
                    self.device.result_from(trip, header.sender)
                except RuntimeError as exc:
                    self._fail_task(trip.task, exc, True)
                    return
            else:
                trip.data = self._segments[trip.task.plan.tensor_id].slot(header.sender, trip.part)
            self._proceed(trip)
        elif header.command == Command.ERROR:
            text = bytes(message.payload).decode(errors="replace") if message.payload is not None else "(no text)"
            error = TransportError(f"local rank {header.sender}: {text}")
            self._peer_failed(header.key >> PARTITION_INDEX_BITS, header.round, error)
        elif header.command == Command.LOCAL_JOINED:
            self._joined.add(header.sender)
            self._revisit()
        else:
            log.error("unexpected %s from local rank %d", command_name(header.command), header.sender)

    def _maybe_reduce(self, entry: Tuple[int, int]) -> None:
        trip = self._waiting.get(entry)
        ready = self._ready.get(entry, [])
        if trip is None:
            if self.joining and ready:
                self._sum_for_joined(entry)
            return
        task, part = trip.task, trip.part
        members = self.members_of(task)
        if self.root_of(task.plan.tensor_id, part, members) != self.local_rank:
            return  # this rank waits for the root's LOCAL_DONE
        absent = self._absent(entry, members, ready)
        if absent is None:
            return
        del self._waiting[entry]
        self._ready.pop(entry, None)
        if absent and task.tag:
            self._fail_task(task, RuntimeError(_joined_text(task.name, absent)), True)
            return
        dtype, flags = int(task.source.dtype), _flags(task)
        for peer in ready:
            if peer.about is not None:  # first round only
                mine = _description(task, self.global_rank)
                if not peer.about.same_tensor(mine):
                    self._fail_task(task, ValueError(
                        f"mismatch for tensor id {task.plan.tensor_id}: worker {peer.about.rank} declares "
                        f"{peer.about.describe()}, worker {self.global_rank} declared {mine.describe()}; "
                        f"{MISMATCH_ADVICE}"), True)
                    return
            if (peer.nbytes, peer.dtype, peer.flags & ~_LOCAL_ZEROS) != (part.nbytes, dtype, flags):
                self._fail_task(task, ValueError(
                    f"push_pull({task.name!r}) partition {part.index}: local rank {peer.rank} has "
                    f"{_describe(peer.nbytes, peer.dtype, peer.flags)}, local rank {self.local_rank} has "
                    f"{_describe(part.nbytes, dtype, flags)}; every worker must push_pull the same tensors"), True)
                return
        if summed_on_gpu(task):
            try:
                self.device.reduce(trip, [peer.rank for peer in ready])
            except RuntimeError as exc:
                self._fail_task(task, exc, True)
            return
        segment = self._segments[task.plan.tensor_id]
        slot = segment.slot(self.local_rank, part)
        # the inputs with bytes in them: a partition of a gather has one, copied; zeros alone leave zeros
        inputs = [] if _zeros_here(trip) else [trip.data]
        inputs += [segment.slot(peer.rank, part) for peer in ready if not peer.flags & _LOCAL_ZEROS]
        slot[:] = inputs[0] if inputs else trip.data
        trip.zeros = not inputs  # the servers need only a header for it
        for other in inputs[1:]:
            kernels.sum_into(slot, other, task.source.dtype)
        self.sums += max(0, len(inputs) - 1)
        if task.round == 0 and part.index == 0 and not absent:
            # Every local rank has mapped the segment (they wrote into it): the name can go.
            # (A rank that joined before mapping it opens it later: the name stays until close().)
            segment.segment.unlink()
        trip.data = slot
        self._proceed(trip)

    # --- join -------------------------------------------------------------------------
    def join(self) -> None:
        """This rank joined (after its last LOCAL_READY): tell the others, sum as zeros from now on."""
        self.joining = True
        self._joined.add(self.local_rank)
        for rank in range(self.local_size):
            if rank != self.local_rank:
                self.channel.send(rank, Command.LOCAL_JOINED, 0, 0)
        self._revisit()

    @property
    def all_joined(self) -> bool:
        """Every local rank's LOCAL_JOINED is in, so every round started before it is complete."""
        return len(self._joined) == self.local_size

    def end_join(self) -> None:
        self.joining = False
        self._joined.clear()
        self._after_join.clear()

    def _revisit(self) -> None:
        """Rounds that waited for a rank that has joined since: complete them with its zeros."""
        for entry in list(self._waiting):
            self._maybe_reduce(entry)
        for entry in list(self._ready):
            if entry not in self._waiting:
                self._maybe_reduce(entry)

    def _absent(self, entry: Tuple[int, int], members: Sequence[int], ready: List[_Ready]) -> Optional[tuple]:
        """The members counted as zeros in ``entry`` (joined ranks that sent nothing), or None to wait on."""
        have = {peer.rank for peer in ready}
        have.add(self.local_rank)
        missing = tuple(rank for rank in members if rank not in have)
        if missing and (entry in self._after_join or any(rank not in self._joined for rank in missing)):
            return None
        return missing

    def _sum_for_joined(self, entry: Tuple[int, int]) -> None:
        """A round this joined rank never started, of a partition it roots: the others' sum, then LOCAL_DONE."""
        ready = self._ready[entry]
        if entry in self._after_join or self._absent(entry, range(self.local_size), ready) is None:
            return
        del self._ready[entry]
        key, round_ = entry
        tensor_id, index = key >> PARTITION_INDEX_BITS, key & (MAX_PARTITIONS - 1)
        first = ready[0]
        segment = self._segments.get(tensor_id)
        nbytes = segment.nbytes if segment is not None else self._sizes.get(tensor_id)
        text = None
        if any((peer.nbytes, peer.dtype, peer.flags & ~_LOCAL_ZEROS) !=
               (first.nbytes, first.dtype, first.flags & ~_LOCAL_ZEROS) for peer in ready):
            text = (f"tensor id {tensor_id} partition {index} round {round_}: local ranks disagree "
                    f"({', '.join(f'{p.rank}: {_describe(p.nbytes, p.dtype, p.flags)}' for p in ready)})")
        elif first.flags & _TAG_BITS:
            text = _joined_text(f"tensor id {tensor_id}", (self.local_rank,))
        elif nbytes is None:
            text = (f"tensor id {tensor_id}: local rank {self.local_rank} joined before the tensor's first round "
                    "reached it, and cannot sum it")
        elif tensor_id in self.device.gpu_tensors:
            text = (f"tensor id {tensor_id}: local rank {self.local_rank} joined (hvd.join()); a CUDA tensor summed "
                    "on the GPU cannot count a joined rank as zeros: set BYTEPS_GPU_LOCAL_AGGREGATION=0")
        if text is not None:
            for peer in ready:
                self.channel.send(peer.rank, Command.ERROR, key, round_, payload=text.encode())
            return
        dtype = DType(first.dtype)
        segment = self._segment_of(tensor_id, nbytes, f"tensor id {tensor_id}")
        part = PartitionPlan.build(tensor_id, nbytes, dtype.itemsize, self.partition_bytes, 1).partitions[index]
        slot = segment.slot(self.local_rank, part)
        slot[:] = 0
        for peer in ready:
            if not peer.flags & _LOCAL_ZEROS:
                kernels.sum_into(slot, segment.slot(peer.rank, part), dtype)
        for peer in ready:
            self.channel.send(peer.rank, Command.LOCAL_DONE, key, round_, part.nbytes, first.dtype)

    # --- failures ----------------------------------------------------------------------
    def _peer_failed(self, tensor_id: int, round_: int, error: BaseException) -> None:
        tasks = {id(trip.task): trip.task for (key, r), trip in self._waiting.items()
                 if key >> PARTITION_INDEX_BITS == tensor_id and r == round_}
        if not tasks:
            self._failed[(tensor_id, round_)] = error
        for task in tasks.values():
            self._fail_task(task, error, False)

    def abandon(self, task) -> None:
        for part in task.plan.partitions:
            self._waiting.pop((part.key, task.round), None)

    def tell_peers(self, task, error: BaseException) -> None:
        """Fail this push_pull on the other local ranks too (they may be waiting on us)."""
        key = task.plan.tensor_id << PARTITION_INDEX_BITS
        for rank in self.members_of(task):
            if rank == self.local_rank:
                continue
            self.channel.send(rank, Command.ERROR, key, task.round, payload=str(error).encode())

    def close(self) -> None:
        self.channel.close()
        for segment in self._segments.values():
            segment.array = None
            segment.segment.unlink()
            segment.segment.close()
        self._segments.clear()


def _flags(task) -> int:
    """FLAG_AVERAGE, and the task's tag in the next 6 bits (a broadcast's root, modulo 63, plus 1); the last
    bit is _LOCAL_ZEROS."""
    tag = (task.tag - 1) % 63 + 1 if task.tag else 0
    return (FLAG_AVERAGE if task.average_over else 0) | tag << 1


def _zeros_here(trip: PartitionTrip) -> bool:
    """Whether this rank's input is all zeros in the trip's partition (asked on the host route only: COPY_IN
    and the root's sum)."""
    return trip.part.outside(trip.task.nonzero)


def _joined_text(what: str, joined: Sequence[int]) -> str:
    return (f"{what}: local rank(s) {', '.join(map(str, joined))} joined (hvd.join()); only allreduces count "
            "a joined rank as zeros: allgather, broadcast and the other collectives need every rank")


def _description(task, rank: int) -> TensorDescription:
    return TensorDescription(task.name, tuple(task.source.shape), task.plan.nbytes, int(task.source.dtype), rank,
                             summed_on_gpu(task))


def _describe(nbytes: int, dtype: int, flags: int) -> str:
    op = describe_op(bool(flags & FLAG_AVERAGE), (flags & _TAG_BITS) >> 1)
    return f"{nbytes} bytes of {dtype_name(dtype)} ({op})"
