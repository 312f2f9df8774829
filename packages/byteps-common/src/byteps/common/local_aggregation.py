"""Summing inside one machine through shared memory, before the network.

With BYTEPS_LOCAL_SIZE = L worker processes on a machine, each tensor has
one shared segment of L slots (one per local rank, see
:mod:`byteps.common.shared_segment`). Every partition has a *local root*,
spread over the local ranks partition by partition (BytePS gives the whole
machine's network work to one process):

1. each other local rank copies its partition into its own slot and sends
   the root LOCAL_READY;
2. once all are ready, the root sums its input and their slots into its own
   slot, pushes that sum to the servers and pulls the job-wide sum back into
   the same slot (with one worker machine there are no servers: the local
   sum is the result);
3. the root sends LOCAL_DONE, and every local rank, root included, copies
   the sum from the root's slot into its output, dividing it when averaging.

So each partition crosses the network once per machine, not once per
process. A slot is never overwritten while someone still reads it: a rank
writes round r + 1 into its slot only after its round r finished, which
the root signalled after reading that slot; the root sums round r + 1 into
its slot only after every other rank reported round r + 1 ready, i.e.
after they all copied round r out.

Control messages are byteps headers on ZeroMQ PUSH/PULL sockets in the
abstract Unix-socket namespace (``ipc://@byteps-<job>-m<machine>-l<rank>``):
nothing on disk to clean up. A failure on one local rank (a size or dtype
that differs, an error from a server) is sent to the others as ERROR, so
every rank fails the push_pull instead of waiting.
"""

from __future__ import annotations

import logging
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import zmq

from byteps.common import kernels
from byteps.common.dtypes import DType
from byteps.common.partition import PARTITION_INDEX_BITS, Partition
from byteps.common.shared_segment import SharedSegment, segment_name
from byteps.transport import Command, TransportError
from byteps.transport.frames import (
    FLAG_AVERAGE,
    HEADER_BYTES,
    FrameError,
    command_name,
    decode_header,
    encode_header,
    json_payload,
    parse_json_payload,
)

__all__ = ["LocalGroup", "local_endpoint"]

log = logging.getLogger("byteps.common.local_aggregation")
_ALIGN = 64
_LINGER_MS = 2000


def local_endpoint(job_id: str, machine: int, local_rank: int) -> str:
    return f"ipc://@byteps-{job_id}-m{machine}-l{local_rank}"


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


class LocalGroup:
    """This process's side of local aggregation: its slots, the peers' sockets and who is ready.

    The owner (the comm thread) calls :meth:`start` for each task, polls
    :attr:`inbox` and hands what arrives to :meth:`receive`. Callbacks tell
    it what to do next: ``reduce_done(task, part, slot)`` when the root has
    the machine's sum of a partition (push it, or finish it),
    ``partition_done(task, part)`` when a partition's result is in the
    task's output, and ``fail_task(task, error, tell_peers)``.
    """

    def __init__(self, context: zmq.Context, job_id: str, machine: int, local_rank: int, local_size: int,
                 reduce_done: Callable, partition_done: Callable, fail_task: Callable) -> None:
        self.job_id, self.machine = job_id, machine
        self.local_rank, self.local_size = local_rank, local_size
        self.global_rank = machine * local_size + local_rank
        self._reduce_done, self._partition_done, self._fail_task = reduce_done, partition_done, fail_task
        # (tensor id, round) another local rank failed before this rank started it
        self._failed: Dict[Tuple[int, int], BaseException] = {}
        self.inbox = context.socket(zmq.PULL)
        self.inbox.setsockopt(zmq.LINGER, 0)
        self.inbox.bind(local_endpoint(job_id, machine, local_rank))
        self._peers: Dict[int, zmq.Socket] = {}
        for rank in range(local_size):
            if rank != local_rank:
                peer = context.socket(zmq.PUSH)
                # An ERROR sent just before this process exits must still reach the peers.
                peer.setsockopt(zmq.LINGER, _LINGER_MS)
                peer.connect(local_endpoint(job_id, machine, rank))
                self._peers[rank] = peer
        self._segments: Dict[int, _TensorSegment] = {}
        # (key, round) -> (rank, partition bytes, dtype, flags, description or None) of each LOCAL_READY;
        # they may arrive before this rank's own task
        self._ready: Dict[Tuple[int, int], List[Tuple[int, int, int, int, Optional[dict]]]] = {}
        # (key, round) -> (task, part) this process waits on, as root (for READY) or not (for DONE)
        self._waiting: Dict[Tuple[int, int], Tuple[object, Partition]] = {}

    def root_of(self, tensor_id: int, part: Partition) -> int:
        return (tensor_id + part.index) % self.local_size

    # --- a task arrives ----------------------------------------------------------------
    def start(self, task) -> None:
        """Put this rank's input where the roots expect it; sum the partitions whose inputs are all ready."""
        failed = self._failed.pop((task.plan.tensor_id, task.round), None)
        if failed is not None:
            self._fail_task(task, failed, False)
            return
        try:
            segment = self._segment_for(task)
        except ValueError as exc:
            self._fail_task(task, exc, True)
            return
        dtype = int(task.source.dtype)
        flags = FLAG_AVERAGE if task.average_over else 0
        for part in task.plan.partitions:
            entry = (part.key, task.round)
            root = self.root_of(task.plan.tensor_id, part)
            self._waiting[entry] = (task, part)
            if root == self.local_rank:
                self._maybe_reduce(entry)
            else:
                segment.slot(self.local_rank, part)[:] = task.source.data[part.offset:part.offset + part.nbytes]
                # The first round says what the tensor is, as INIT_KEY does to a server.
                about = json_payload(_description(task, self.global_rank)) if task.round == 0 else None
                self._send(root, Command.LOCAL_READY, part.key, task.round, part.nbytes, dtype, flags, about)

    def _segment_for(self, task) -> _TensorSegment:
        tensor_id = task.plan.tensor_id
        segment = self._segments.get(tensor_id)
        if segment is not None and segment.nbytes != task.plan.nbytes:
            raise ValueError(
                f"push_pull({task.name!r}): {task.plan.nbytes} bytes, but earlier rounds had {segment.nbytes}; "
                "a tensor keeps its size for the whole job")
        if segment is None:
            name = segment_name(self.job_id, self.machine, tensor_id)
            shared = SharedSegment.open_or_create(name, self.local_size * _slot_bytes(task.plan.nbytes))
            segment = self._segments[tensor_id] = _TensorSegment(shared, task.plan.nbytes)
        return segment

    # --- messages from the other local ranks ------------------------------------------------
    def receive(self) -> None:
        frames = self.inbox.recv_multipart(copy=True)
        try:
            header = decode_header(frames[0], 1 << 40) if len(frames[0]) == HEADER_BYTES else None
        except FrameError:
            header = None
        if header is None:
            log.error("malformed local message (%d frames) ignored", len(frames))
            return
        entry = (header.key, header.round)
        if header.command == Command.LOCAL_READY:
            about = parse_json_payload(frames[1]) if len(frames) > 1 else None
            self._ready.setdefault(entry, []).append(
                (header.sender, header.aux, header.dtype, header.flags, about))
            self._maybe_reduce(entry)
        elif header.command == Command.LOCAL_DONE:
            waiting = self._waiting.pop(entry, None)
            if waiting is not None:
                task, part = waiting
                self._copy_out(task, part, header.sender)
        elif header.command == Command.ERROR:
            text = frames[1].decode(errors="replace") if len(frames) > 1 else "(no text)"
            error = TransportError(f"local rank {header.sender}: {text}")
            self._peer_failed(header.key >> PARTITION_INDEX_BITS, header.round, error)
        else:
            log.error("unexpected %s from local rank %d", command_name(header.command), header.sender)

    def _maybe_reduce(self, entry: Tuple[int, int]) -> None:
        waiting = self._waiting.get(entry)
        ready = self._ready.get(entry, [])
        if waiting is None or len(ready) < self.local_size - 1:
            return
        task, part = waiting
        del self._ready[entry]
        dtype = int(task.source.dtype)
        flags = FLAG_AVERAGE if task.average_over else 0
        for rank, nbytes, peer_dtype, peer_flags, about in ready:
            mine = _description(task, self.global_rank) if about is not None else None  # first round only
            if about is not None and {k: about.get(k) for k in _COMPARED} != {k: mine[k] for k in _COMPARED}:
                self._fail_task(task, ValueError(
                    f"mismatch for tensor id {task.plan.tensor_id}: worker {about.get('rank')} declares "
                    f"{_describe_tensor(about)}, worker {self.global_rank} declared {_describe_tensor(mine)}; "
                    "every worker must push_pull the same tensors (same names, shapes, dtypes, order)"), True)
                return
            if (nbytes, peer_dtype, peer_flags) != (part.nbytes, dtype, flags):
                self._fail_task(task, ValueError(
                    f"push_pull({task.name!r}) partition {part.index}: local rank {rank} has "
                    f"{_describe(nbytes, peer_dtype, peer_flags)}, local rank {self.local_rank} has "
                    f"{_describe(part.nbytes, dtype, flags)}; every worker must push_pull the same tensors"), True)
                return
        segment = self._segments[task.plan.tensor_id]
        slot = segment.slot(self.local_rank, part)
        slot[:] = task.source.data[part.offset:part.offset + part.nbytes]
        for rank, *_ in ready:
            kernels.sum_into(slot, segment.slot(rank, part), task.source.dtype)
        if task.round == 0 and part.index == 0:
            # Every local rank has mapped the segment (they wrote into it): the name can go.
            segment.segment.unlink()
        self._reduce_done(task, part, slot)

    def finish(self, task, part: Partition) -> None:
        """The root has the final sum in its slot: release the others and copy it out here too."""
        for rank in self._peers:
            self._send(rank, Command.LOCAL_DONE, part.key, task.round, part.nbytes, int(task.source.dtype), 0)
        self._waiting.pop((part.key, task.round), None)
        self._copy_out(task, part, self.local_rank)

    def _copy_out(self, task, part: Partition, root: int) -> None:
        source = self._segments[task.plan.tensor_id].slot(root, part)
        target = task.output.data[part.offset:part.offset + part.nbytes]
        if task.average_over > 1:
            kernels.scale_into(target, source, task.output.dtype, task.average_over)
        else:
            target[:] = source
        self._partition_done(task, part)

    # --- failures ----------------------------------------------------------------------
    def _peer_failed(self, tensor_id: int, round_: int, error: BaseException) -> None:
        tasks = {id(task): task for (key, r), (task, _) in self._waiting.items()
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
        for rank in self._peers:
            self._send(rank, Command.ERROR, key, task.round, payload=str(error).encode())

    def _send(self, rank: int, command: int, key: int, round_: int, nbytes: int = 0, dtype: int = 0,
              flags: int = 0, payload: Optional[bytes] = None) -> None:
        """A header to one local peer; the partition's size travels in ``aux``, a payload in a second frame."""
        header = encode_header(command, self.local_rank, key, round_, len(payload or b""), dtype, flags, nbytes)
        if payload is not None:
            self._peers[rank].send_multipart([header, payload])
        else:
            self._peers[rank].send(header)

    def close(self) -> None:
        for peer in self._peers.values():
            peer.close(_LINGER_MS)
        self.inbox.close(0)
        for segment in self._segments.values():
            segment.array = None
            segment.segment.unlink()
            segment.segment.close()
        self._segments.clear()


_COMPARED = ("name", "shape", "nbytes", "dtype")


def _description(task, rank: int) -> dict:
    return {"name": task.name, "shape": list(task.source.shape), "nbytes": task.plan.nbytes,
            "dtype": int(task.source.dtype), "rank": rank}


def _dtype_name(dtype: int) -> str:
    try:
        return DType(dtype).name.lower()
    except ValueError:
        return f"dtype code {dtype}"


def _describe_tensor(about: dict) -> str:
    shape = "x".join(map(str, about.get("shape") or [])) or "scalar"
    dtype = _dtype_name(about.get("dtype", -1))
    return f"tensor {about.get('name')!r} (shape {shape}, {about.get('nbytes')} bytes of {dtype})"


def _describe(nbytes: int, dtype: int, flags: int) -> str:
    return f"{nbytes} bytes of {_dtype_name(dtype)} ({'average' if flags & FLAG_AVERAGE else 'sum'})"
