"""The PUSH and PULL stages: partitions to the servers and their sums back, within a credit.

A trip at PUSH waits in a :class:`~byteps.common.scheduling.CreditQueue`
and goes out in priority order while the credit allows (the transport reads its
bytes in place); each PUSH_ACK returns credit. At PULL it asks for the
round's sum, which lands straight where the next stage wants it: in the
output, in the local root's shared slot, or, when COPY_OUT must divide it,
held as the received message.

Pipelined (the default), PUSH is done once sent, so its PULL follows at
once and a partition's sum comes back while later partitions are still
being pushed: both directions of the NIC work at the same time. The push
itself carries the pull (FLAG_PULL): one message where two were, and the
server leaves out the PUSH_ACK when it answers at once. With
BYTEPS_PIPELINE=0 (a switch for measurements) PUSH is done when
acknowledged and a task's PULLs wait until every one of its pushes was:
push everything, then pull everything, like MXNet's KVStore.
"""

from __future__ import annotations

import logging
from typing import Callable, Dict, List, Optional, Set, Tuple

from byteps.common.route import PartitionTrip, Stage
from byteps.common.scheduling import CreditQueue
from byteps.common.tensor_description import PartitionSpec, split_quorum_aux
from byteps.transport import (
    FLAG_AVERAGE,
    FLAG_BARE,
    FLAG_PULL,
    FLAG_SKIPPED,
    FLAG_ZEROS,
    Command,
    Context,
    Endpoint,
    FrameError,
    TransportError,
    command_name,
    json_payload,
    tcp_address,
)

__all__ = ["ServerExchange", "partition_spec"]

log = logging.getLogger("byteps.common.server_exchange")


def partition_spec(trip: PartitionTrip) -> PartitionSpec:
    """What INIT_KEY tells a server about a partition; the server checks every worker's against the first."""
    task, part = trip.task, trip.part
    return PartitionSpec(name=task.name, partition=part.index, shape=tuple(task.source.shape),
                         tensor_nbytes=task.plan.nbytes, nbytes=part.nbytes, dtype=int(task.source.dtype),
                         contributors=task.machines, asynchronous=task.asynchronous, quorum=task.quorum,
                         compression=task.compression.wire() if task.compression is not None else None)


class ServerExchange:
    """This worker's connections to the servers, and the trips at PUSH or PULL on them."""

    def __init__(self, context: Context, servers: List[Tuple[str, int]], rank: int, max_payload_bytes: int,
                 credit_bytes: int, pipeline: bool, proceed: Callable[[PartitionTrip], None],
                 fail_key: Callable[[int, int, BaseException], None], alone: bool) -> None:
        self.rank = rank
        #: this process pushes its own tensors (no local peers): where a task is zero, so is what it pushes
        self.alone = alone
        self.connections: List[Endpoint] = [context.connect(tcp_address(host, port), max_payload_bytes)
                                            for host, port in servers]
        self.pipeline = pipeline
        self.queue = CreditQueue(credit_bytes if pipeline else 0)
        self._proceed = proceed
        self._fail_key = fail_key
        self._initialized: Set[int] = set()
        self._in_flight: Dict[Tuple[int, int], PartitionTrip] = {}  # (key, round) pushed, sum not back
        self._abandoned: Set[Tuple[int, int]] = set()  # failed trips whose answers may still come
        self._held_pulls: Dict[int, List[PartitionTrip]] = {}  # unpipelined: id(task) -> trips at PULL

    def _all_zeros(self, trip: PartitionTrip) -> bool:
        """Whether the push of ``trip`` is all zeros (a header flagged zeros): no local rank had bytes in it, or
        this process pushes alone and the partition lies wholly outside its task's nonzero bytes."""
        return trip.zeros or (self.alone and trip.part.outside(trip.task.nonzero))

    def _credit(self, trip: PartitionTrip) -> int:
        """Bytes a push of ``trip`` takes from the credit until acknowledged: none for a header alone."""
        return 0 if self._all_zeros(trip) else trip.part.nbytes

    # --- the PUSH stage -----------------------------------------------------------------
    def push(self, trip: PartitionTrip) -> None:
        if self._all_zeros(trip):
            # A header alone goes at once, never behind this worker's credit-bound pushes: it is what
            # completes the other ranks' rounds of a gather (their bytes, this rank's zeros), so held back
            # it would make every other rank wait until this one had pushed all of its own bytes.
            self._send_push(trip)
            return
        self.queue.add((trip.task.plan.tensor_id, trip.part.index), self._credit(trip), trip)
        self.send_ready()

    def send_ready(self) -> None:
        for trip in self.queue.sendable():
            self._send_push(trip)

    def _send_push(self, trip: PartitionTrip) -> None:
        task, part = trip.task, trip.part
        connection = self.connections[part.server]
        if part.key not in self._initialized:
            connection.send(Command.INIT_KEY, self.rank, part.key, payload=json_payload(partition_spec(trip).to_json()))
            self._initialized.add(part.key)
        self._in_flight[(part.key, task.round)] = trip
        flags, payload = FLAG_AVERAGE if task.average_over else 0, trip.data
        if self._all_zeros(trip):
            flags, payload = flags | FLAG_ZEROS, None  # the server counts zeros; nothing crosses the wire
        if self.pipeline:  # the PULL stage follows at once (plan_route puts it right after PUSH): send it here
            self._mark_bare(trip)
            flags |= FLAG_PULL | self._bare_flag(trip)
        connection.send(Command.PUSH, self.rank, part.key, task.round, payload=payload,
                        dtype=int(task.source.dtype), flags=flags, aux=task.tag)
        if self.pipeline:
            self._proceed(trip)

    # --- the PULL stage -----------------------------------------------------------------
    def pull(self, trip: PartitionTrip) -> None:
        self._mark_bare(trip)
        trip.landing = self._landing(trip)  # before any answer is received: this thread sent the pull just now
        if trip.task.skipped:  # a closed round, pulled without a push: no credit, no INIT_KEY to send
            trip.acked = True
            self._in_flight[(trip.part.key, trip.task.round)] = trip
            self._send_pull(trip, FLAG_SKIPPED)
            return
        if self.pipeline:
            return  # the push carried this pull (FLAG_PULL)
        task = trip.task
        held = self._held_pulls.setdefault(id(task), [])
        held.append(trip)
        if len(held) == task.network_partitions:
            del self._held_pulls[id(task)]
            for waiting in held:
                self._send_pull(waiting)

    @staticmethod
    def _mark_bare(trip: PartitionTrip) -> None:
        if trip.task.skip_pull and trip.part.inside(trip.task.skip_pull):
            trip.pull_nbytes = 0  # only the round's completion is asked for: a bare pull

    @staticmethod
    def _bare_flag(trip: PartitionTrip) -> int:
        """FLAG_BARE for a pull that asks only for the round's completion, else 0."""
        return 0 if trip.pull_nbytes else FLAG_BARE

    def _send_pull(self, trip: PartitionTrip, flags: int = 0) -> None:
        flags |= self._bare_flag(trip)
        self.connections[trip.part.server].send(Command.PULL, self.rank, trip.part.key, trip.task.round,
                                                dtype=int(trip.task.source.dtype), flags=flags)

    def _landing(self, trip: PartitionTrip):
        """Where a sum is received: None keeps the message for COPY_OUT to divide (or DECOMPRESS to decode)."""
        if not trip.pull_nbytes:
            return None  # a bare pull: nothing to receive
        if trip.next_stage is Stage.DECOMPRESS:
            return None
        if trip.next_stage is Stage.COPY_OUT:
            return None if trip.task.average_over > 1 else trip.output
        return trip.data  # the local root's slot, summed in place

    def _destination(self, header):
        if header.command != Command.PULL_RESPONSE:
            return None
        trip = self._in_flight.get((header.key, header.round))
        if trip is None or trip.pull_nbytes != header.payload_bytes:
            return None
        return trip.landing

    # --- receiving ----------------------------------------------------------------------
    def receive(self, connection: Endpoint) -> None:
        try:
            message = connection.recv(self._destination)
        except FrameError as exc:
            raise TransportError(f"malformed message from server {connection.address}: {exc}") from exc
        header = message.header
        entry = (header.key, header.round)
        if entry in self._abandoned:
            if header.command == Command.PULL_RESPONSE:
                self._abandoned.discard(entry)
            return  # an answer or complaint about a push_pull that has already failed
        if header.command == Command.ERROR:
            text = bytes(message.payload).decode(errors="replace") if message.payload is not None else ""
            self._fail_key(header.key, header.round, TransportError(f"server {connection.address}: {text}"))
            return
        trip = self._in_flight.get(entry)
        if header.command == Command.PUSH_ACK and trip is not None and not trip.acked:
            trip.acked = True
            self.queue.release(self._credit(trip))
            if not self.pipeline:
                self._proceed(trip)
            self.send_ready()
            return
        landing = None if trip is None else trip.landing
        # A bare pull's answer is a header; a server before FLAG_BARE sends the sum anyway, which is dropped.
        bare = (header.command == Command.PULL_RESPONSE and trip is not None and not trip.pull_nbytes
                and header.payload_bytes in (0, trip.part.nbytes))
        if not bare and (header.command != Command.PULL_RESPONSE or trip is None
                         or header.payload_bytes != trip.pull_nbytes
                         or (message.payload is None) != (landing is not None)):
            raise TransportError(
                f"unexpected {command_name(header.command)} for key {header.key} round {header.round} "
                f"({header.payload_bytes} bytes) from server {connection.address}")
        if trip.task.quorum:
            machines, closed_after = split_quorum_aux(header.aux)
            if machines != trip.task.quorum:
                raise TransportError(f"server {connection.address} summed {machines} machines' pushes of key "
                                     f"{header.key} round {header.round}, not the {trip.task.quorum} expected "
                                     "(BYTEPS_BACKUP_WORKERS must be the same everywhere)")
            task = trip.task
            task.closed_after = closed_after if task.closed_after is None else min(task.closed_after, closed_after)
        del self._in_flight[entry]
        if not trip.acked:  # a push that carried its pull and was answered at once is not acknowledged
            self.queue.release(self._credit(trip))
            self.send_ready()
        if bare:
            trip.data = trip.output  # the output keeps what it holds: COPY_OUT leaves it
        else:
            trip.data = message.payload if landing is None else landing
        self._proceed(trip)

    def send_join(self) -> None:
        """Tell every server this worker machine joined (after its last push, on the same connections)."""
        for connection in self.connections:
            connection.send(Command.JOIN, self.rank)

    # --- failures -----------------------------------------------------------------------
    def report_failure(self, task, parts, error: BaseException) -> None:
        """Tell the servers of ``parts`` that this round failed here, so the other machines fail it too
        instead of waiting for a push that will not come."""
        text = f"worker {self.rank}: {error}".encode()
        for part in parts:
            self.connections[part.server].send(Command.ERROR, self.rank, part.key, task.round, payload=text)

    def abandon(self, task) -> None:
        """Forget a failed task's trips; answers still on their way are dropped."""
        for part in task.plan.partitions:
            trip = self._in_flight.pop((part.key, task.round), None)
            if trip is not None:
                self._abandoned.add((part.key, task.round))
                if not trip.acked:
                    self.queue.release(self._credit(trip))
        self._held_pulls.pop(id(task), None)
        self.queue.discard(lambda trip: trip.task is task)

    @property
    def bytes_sent(self) -> int:
        return sum(c.counters.bytes_sent for c in self.connections)

    @property
    def bytes_received(self) -> int:
        return sum(c.counters.bytes_received for c in self.connections)

    @property
    def shared_payloads(self) -> int:
        """Payloads that went to or came from a server on this host through shared memory."""
        return sum(c.counters.shared_sent + c.counters.shared_received for c in self.connections)

    @property
    def rdma_payloads(self) -> int:
        """Payloads that went to or came from a server by RDMA WRITE (DMLC_ENABLE_RDMA)."""
        return sum(c.counters.rdma_sent + c.counters.rdma_received for c in self.connections)

    def close(self, linger_ms: Optional[int] = None) -> None:
        for connection in self.connections:
            connection.close(linger_ms)
