"""The EXCHANGE stage: a partition to its server and the round's sum back, within a credit.

A trip at EXCHANGE waits in a :class:`~byteps.common.engine.credit_queue.CreditQueue`
and its push goes out in priority order while the credit allows (the
transport reads its bytes in place); each PUSH_ACK returns credit. The
stage is finished when the round's sum is back. The sum lands straight
where the route wants it (:class:`~byteps.common.engine.route.Landing`):
in the output, in the local root's slot, or, when COPY_OUT must divide it
or DECOMPRESS decode it, held as the received message.

Pipelined (the default), the push carries the pull (FLAG_PULL): one
message per partition, and a partition's sum comes back while later
partitions are still being pushed, so both directions of the NIC work at
once; the server leaves out the PUSH_ACK when it answers at once. With
BYTEPS_PIPELINE=0 (a switch for measurements) a task's pulls wait until
every one of its pushes was acknowledged: push everything, then pull
everything, like MXNet's KVStore. A skipped round (backup workers) is a
pull alone, flagged FLAG_SKIPPED.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from byteps.common.engine.credit_queue import CreditQueue
from byteps.common.engine.route import Landing, Stage
from byteps.common.engine.stage import NOTHING, WAIT, KeyRefused, Outcome
from byteps.common.engine.task import PartitionTrip, PushPullTask
from byteps.common.partition import Partition
from byteps.common.row_sparse import is_sparse_key
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

log = logging.getLogger("byteps.common.engine.exchange")


def partition_spec(task: PushPullTask, part: Partition) -> PartitionSpec:
    """What INIT_KEY tells a server about ``task``'s partition ``part``; the server checks every worker's against
    the first."""
    return PartitionSpec(name=task.name, partition=part.index, shape=tuple(task.source.shape),
                         tensor_nbytes=task.plan.nbytes, nbytes=part.nbytes, dtype=int(task.source.dtype),
                         contributors=task.machines, asynchronous=task.asynchronous, quorum=task.quorum,
                         compression=task.compression.wire() if task.compression is not None else None)


class ServerExchange:
    """This worker's connections to the servers, and the trips at EXCHANGE on them.

    ``alone``: this process pushes its own tensors (no local peers), so where
    a task is zeros (outside its ``nonzero`` bytes) so is what it pushes.
    """

    def __init__(self, context: Context, servers: List[Tuple[str, int]], rank: int, max_payload_bytes: int,
                 credit_bytes: int, pipeline: bool, alone: bool) -> None:
        self.rank = rank
        self.alone = alone
        self.connections: List[Endpoint] = [context.connect(tcp_address(host, port), max_payload_bytes)
                                            for host, port in servers]
        self.pipeline = pipeline
        self.queue = CreditQueue(credit_bytes if pipeline else 0)
        self._initialized: Set[int] = set()
        self._in_flight: Dict[Tuple[int, int], PartitionTrip] = {}  # (key, round) pushed, sum not back
        self._abandoned: Set[Tuple[int, int]] = set()  # failed trips whose answers may still come
        self._acked: Dict[PushPullTask, List[PartitionTrip]] = {}  # unpipelined: trips acknowledged, pull held
        #: The row-sparse exchange (byteps.common.engine.sparse_exchange), set by the engine: it gets every
        #: message about a table's key (row_sparse.is_sparse_key), received here: these connections are its too.
        self.sparse: Any = None

    def runners(self):
        return {Stage.EXCHANGE: self.exchange}

    # --- the stage ----------------------------------------------------------------------
    def exchange(self, trip: PartitionTrip) -> Outcome:
        task = trip.task
        if task.skip_pull and trip.part.inside(task.skip_pull):
            trip.pull_nbytes = 0  # only the round's completion is asked for: a bare pull
        trip.landing = self._landing(trip)  # before any answer is received
        if task.skipped:  # a closed round, pulled without a push: no credit, no INIT_KEY to send
            trip.acked = True
            self._in_flight[(trip.part.key, task.round)] = trip
            self._send_pull(trip, FLAG_SKIPPED)
            return WAIT
        if self._all_zeros(trip):
            # A header alone goes at once, never behind this worker's credit-bound pushes: it is what
            # completes the other ranks' rounds of a gather (their bytes, this rank's zeros), so held back
            # it would make every other rank wait until this one had pushed all of its own bytes.
            self._send_push(trip)
            return WAIT
        self.queue.add((task.plan.tensor_id, trip.part.index), trip.part.nbytes, trip)
        self._send_ready()
        return WAIT

    def _all_zeros(self, trip: PartitionTrip) -> bool:
        """Whether the push of ``trip`` is all zeros (a header flagged zeros): no local rank had bytes in it, or
        this process pushes alone and the partition lies wholly outside its task's nonzero bytes."""
        return trip.zeros or (self.alone and trip.part.outside(trip.task.nonzero))

    def _credit(self, trip: PartitionTrip) -> int:
        """Bytes a push of ``trip`` takes from the credit until acknowledged: none for a header alone."""
        return 0 if self._all_zeros(trip) else trip.part.nbytes

    def _landing(self, trip: PartitionTrip):
        """Where a sum is received: None keeps the message for COPY_OUT to divide (or DECOMPRESS to decode)."""
        if not trip.pull_nbytes or trip.route.compressed:
            return None
        if trip.route.landing is Landing.OUTPUT:
            return None if trip.task.average_over > 1 else trip.output
        return trip.data  # the local root's slot, summed in place

    def _send_ready(self) -> None:
        for trip in self.queue.sendable():
            self._send_push(trip)

    def _send_push(self, trip: PartitionTrip) -> None:
        task, part = trip.task, trip.part
        connection = self.connections[part.server]
        if part.key not in self._initialized:
            spec = partition_spec(task, part)
            connection.send(Command.INIT_KEY, self.rank, part.key, task.round, payload=json_payload(spec.to_json()))
            self._initialized.add(part.key)
        self._in_flight[(part.key, task.round)] = trip
        flags, payload = FLAG_AVERAGE if task.options.average else 0, trip.data
        if self._all_zeros(trip):
            flags, payload = flags | FLAG_ZEROS, None  # the server counts zeros; nothing crosses the wire
        if self.pipeline:
            flags |= FLAG_PULL if trip.pull_nbytes else FLAG_PULL | FLAG_BARE
        connection.send(Command.PUSH, self.rank, part.key, task.round, payload=payload,
                        dtype=int(task.source.dtype), flags=flags, aux=task.tag)
        if trip.stage_started and self.pipeline:
            trip.sent_at = time.time()

    def _send_pull(self, trip: PartitionTrip, flags: int = 0) -> None:
        flags |= 0 if trip.pull_nbytes else FLAG_BARE
        self.connections[trip.part.server].send(Command.PULL, self.rank, trip.part.key, trip.task.round,
                                                dtype=int(trip.task.source.dtype), flags=flags)

    def _destination(self, header):
        if header.command != Command.PULL_RESPONSE:
            return None
        trip = self._in_flight.get((header.key, header.round))
        if trip is None or trip.pull_nbytes != header.payload_bytes:
            return None
        return trip.landing

    # --- what the servers send ----------------------------------------------------------
    def receive(self, connection: Endpoint):
        """One message from a server: the trips it finishes (a list), or a refusal to deliver."""
        try:
            message = connection.recv(self._destination)
        except FrameError as exc:
            raise TransportError(f"malformed message from server {connection.address}: {exc}") from exc
        header = message.header
        if self.sparse is not None and is_sparse_key(header.key):
            return self.sparse.receive(message, connection)
        entry = (header.key, header.round)
        if entry in self._abandoned:
            if header.command == Command.PULL_RESPONSE:
                self._abandoned.discard(entry)
            return NOTHING  # an answer or complaint about a push_pull that has already failed
        if header.command == Command.ERROR:
            text = message.text("")
            return [KeyRefused(header.key, TransportError(f"server {connection.address}: {text}"))]
        trip = self._in_flight.get(entry)
        if header.command == Command.PUSH_ACK and trip is not None and not trip.acked:
            trip.acked = True
            self.queue.release(self._credit(trip))
            if not self.pipeline:
                self._pull_when_all_acked(trip)
            self._send_ready()
            return NOTHING
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
        task = trip.task
        if task.quorum:
            machines, closed_after = split_quorum_aux(header.aux)
            if machines != task.quorum:
                raise TransportError(f"server {connection.address} summed {machines} machines' pushes of key "
                                     f"{header.key} round {header.round}, not the {task.quorum} expected "
                                     "(BYTEPS_BACKUP_WORKERS must be the same everywhere)")
            trip.closed_after = closed_after
            task.close_rounds_early(closed_after)
        del self._in_flight[entry]
        if not trip.acked:  # a push that carried its pull and was answered at once is not acknowledged
            self.queue.release(self._credit(trip))
            self._send_ready()
        if bare:
            trip.data = trip.output  # the output keeps what it holds: COPY_OUT leaves it
        else:
            trip.data = message.payload if landing is None else landing
        return [trip]

    def _pull_when_all_acked(self, trip: PartitionTrip) -> None:
        """Unpipelined: a task's pulls go once every one of its pushes was acknowledged."""
        if trip.stage_started:
            trip.sent_at = time.time()
        task = trip.task
        acked = self._acked.setdefault(task, [])
        acked.append(trip)
        if len(acked) == task.network_partitions:
            del self._acked[task]
            for waiting in acked:
                self._send_pull(waiting)

    def send_join(self) -> None:
        """Tell every server this worker machine joined (after the machine's last push was answered)."""
        for connection in self.connections:
            connection.send(Command.JOIN, self.rank)

    # --- failures -----------------------------------------------------------------------
    def report_failure(self, task: PushPullTask, parts, error: BaseException) -> None:
        """Tell the servers of ``parts`` that this round failed here, so the other machines fail it too
        instead of waiting for a push that will not come."""
        for part in parts:
            self.report_round(part.key, task.round, part.server, error)

    def report_round(self, key: int, round_: int, server: int, error: BaseException) -> None:
        """Tell ``server`` that round ``round_`` of ``key`` failed here: it fails the round on the other machines."""
        text = f"worker {self.rank}: {error}".encode()
        self.connections[server].send(Command.ERROR, self.rank, key, round_, payload=text)

    def abandon(self, task: PushPullTask) -> None:
        """Forget a failed task's trips; answers still on their way are dropped."""
        for part in task.plan.partitions:
            trip = self._in_flight.pop((part.key, task.round), None)
            if trip is not None:
                self._abandoned.add((part.key, task.round))
                if not trip.acked:
                    self.queue.release(self._credit(trip))
        self._acked.pop(task, None)
        self.queue.discard(lambda trip: trip.task is task)

    # --- counters -----------------------------------------------------------------------
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
