"""Pushing partitions to the servers and pulling their sums back, within a credit.

One :class:`PartitionWork` is one partition's trip through a server: PUSH
its bytes (read in place by ZeroMQ), PULL the round's sum straight into its
destination (or divide it on the way, when averaging into a final output).
Works wait in a :class:`~byteps.common.scheduling.CreditQueue` and go out
in priority order while the credit allows; each PUSH_ACK returns credit.

Pipelined (the default), each PUSH is followed at once by its PULL, so a
partition's sum comes back while later partitions are still being pushed:
both directions of the NIC work at the same time. With BYTEPS_PIPELINE=0
(a switch for measurements) a task's PULLs wait until every one of its
pushes was acknowledged: push everything, then pull everything, like
MXNet's KVStore.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Dict, List, Set, Tuple

import numpy as np
import zmq

from byteps.common import kernels
from byteps.common.partition import Partition
from byteps.common.scheduling import CreditQueue
from byteps.transport import Command, Connection, FrameError, TransportError
from byteps.transport.frames import FLAG_AVERAGE, command_name, json_payload

__all__ = ["PartitionWork", "ServerExchange"]

log = logging.getLogger("byteps.common.server_exchange")


@dataclasses.dataclass(eq=False)
class PartitionWork:
    """One partition of one task on its way through a server."""

    task: object  # the PushPullTask
    part: Partition
    source: np.ndarray  # uint8 bytes pushed
    destination: np.ndarray  # uint8 bytes the sum lands in
    divisor: int  # > 1: divide while copying out of the response
    on_summed: Callable[[PartitionWork], None]
    acked: bool = False


class ServerExchange:
    """This worker's connections to the servers and the works in flight on them."""

    def __init__(self, context: zmq.Context, servers: List[Tuple[str, int]], rank: int, max_payload_bytes: int,
                 credit_bytes: int, pipeline: bool, fail_key: Callable[[int, int, BaseException], None]) -> None:
        self.rank = rank
        self.connections = [Connection(context, host, port, max_payload_bytes) for host, port in servers]
        self.pipeline = pipeline
        self.queue = CreditQueue(credit_bytes if pipeline else 0)
        self._fail_key = fail_key
        self._initialized: Set[int] = set()
        self._in_flight: Dict[Tuple[int, int], PartitionWork] = {}
        self._abandoned: Set[Tuple[int, int]] = set()  # failed works whose answers may still come
        self._held_pulls: Dict[int, List[PartitionWork]] = {}  # unpipelined: id(task) -> acked works

    # --- sending ------------------------------------------------------------------------
    def submit(self, work: PartitionWork) -> None:
        task = work.task
        self.queue.add((task.plan.tensor_id, work.part.index), work.part.nbytes, work)
        self.send_ready()

    def send_ready(self) -> None:
        for work in self.queue.sendable():
            self._send(work)

    def _send(self, work: PartitionWork) -> None:
        task, part = work.task, work.part
        connection = self.connections[part.server]
        dtype = int(task.source.dtype)
        if part.key not in self._initialized:
            description = {
                "name": task.name, "partition": part.index, "shape": list(task.source.shape),
                "tensor_nbytes": task.plan.nbytes, "nbytes": part.nbytes, "dtype": dtype,
            }
            connection.send(Command.INIT_KEY, self.rank, part.key, payload=json_payload(description))
            self._initialized.add(part.key)
        self._in_flight[(part.key, task.round)] = work
        connection.send(Command.PUSH, self.rank, part.key, task.round, payload=work.source, dtype=dtype,
                        flags=FLAG_AVERAGE if task.average_over else 0)
        if self.pipeline:
            connection.send(Command.PULL, self.rank, part.key, task.round, dtype=dtype)

    def _send_pull(self, work: PartitionWork) -> None:
        self.connections[work.part.server].send(Command.PULL, self.rank, work.part.key, work.task.round,
                                                dtype=int(work.task.source.dtype))

    # --- receiving ----------------------------------------------------------------------
    def _destination(self, header):
        """Receive a sum straight into its destination unless it must be divided on the way."""
        if header.command != Command.PULL_RESPONSE:
            return None
        work = self._in_flight.get((header.key, header.round))
        if work is None or work.part.nbytes != header.payload_bytes or work.divisor > 1:
            return None
        return work.destination

    def receive(self, connection: Connection) -> None:
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
            text = bytes(message.payload.buffer).decode(errors="replace") if message.payload else ""
            self._fail_key(header.key, header.round, TransportError(f"server {connection.address}: {text}"))
            return
        work = self._in_flight.get(entry)
        if header.command == Command.PUSH_ACK and work is not None and not work.acked:
            work.acked = True
            self.queue.release(work.part.nbytes)
            if not self.pipeline:
                self._hold_pull(work)
            self.send_ready()
            return
        if (header.command != Command.PULL_RESPONSE or work is None or header.payload_bytes != work.part.nbytes
                or (message.payload is not None) != (work.divisor > 1)):
            raise TransportError(
                f"unexpected {command_name(header.command)} for key {header.key} round {header.round} "
                f"({header.payload_bytes} bytes) from server {connection.address}")
        del self._in_flight[entry]
        if not work.acked:  # the ack is sent before the answer; tolerate it anyway
            self.queue.release(work.part.nbytes)
        if work.divisor > 1:
            kernels.scale_into(work.destination, message.payload.buffer, work.task.output.dtype, work.divisor)
        work.on_summed(work)

    def _hold_pull(self, work: PartitionWork) -> None:
        task = work.task
        held = self._held_pulls.setdefault(id(task), [])
        held.append(work)
        if len(held) == task.network_partitions:
            del self._held_pulls[id(task)]
            for acked in held:
                self._send_pull(acked)

    # --- failures -----------------------------------------------------------------------
    def abandon(self, task) -> None:
        """Forget a failed task's works; answers still on their way are dropped."""
        for part in task.plan.partitions:
            work = self._in_flight.pop((part.key, task.round), None)
            if work is not None:
                self._abandoned.add((part.key, task.round))
                if not work.acked:
                    self.queue.release(part.nbytes)
        self._held_pulls.pop(id(task), None)
        self.queue.discard(lambda work: work.task is task)

    @property
    def bytes_sent(self) -> int:
        return sum(c.counters.bytes_sent for c in self.connections)

    @property
    def bytes_received(self) -> int:
        return sum(c.counters.bytes_received for c in self.connections)

    def close(self) -> None:
        for connection in self.connections:
            connection.close()
