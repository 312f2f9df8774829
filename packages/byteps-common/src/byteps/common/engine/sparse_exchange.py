"""SPARSE_EXCHANGE and SPARSE_MERGE: a row-sparse task's records to their servers, the servers' unions merged.

:class:`SparseExchange` owns the two stages of
:data:`~byteps.common.engine.route.SPARSE_ROUTE`. SPARSE_EXCHANGE sends a
shard's INIT_KEY (the first time: the table as a
:class:`~byteps.common.tensor_description.PartitionSpec` with ``sparse``)
and its PUSH, which always carries its pull (FLAG_PULL), over the same
server connections as the dense exchange, which hands it every message
whose key is a table's (:func:`~byteps.common.row_sparse.is_sparse_key`). The
stage is done when the server's answer is back: the round's union of ids
on that server with their sums. SPARSE_MERGE puts the servers' answers
together once the last is in: ids ascending (each id lives on one server,
so the union is a sort of disjoint parts), rows averaged when asked.

A server-held table (``task.table.held``) takes the same two stages for
its rounds (the servers apply the rows and answer none) and for its
lookups (``task.lookup``): each shard is then one PULL flagged
FLAG_LOOKUP whose payload is row ids, answered with their rows at once,
outside the table's rounds; the merge puts the rows of every shard in id
order.

A shard's records go in one PUSH per payload (each at most
BYTEPS_PARTITION_BYTES, whole records in order), every one carrying the
number of them in its header's ``aux`` and the last one the pull
(FLAG_PULL); the server answers the same way, ``aux`` PULL_RESPONSEs of
whole records in order, which are put together here. Sparse pushes hold
no scheduling credit: a push's size is known only once the caller's rows
are cut by server. A server's PUSH_ACK (sent while the round waits for
other machines) is therefore dropped here.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Set, Tuple

import numpy as np

from byteps.common.engine.route import Stage
from byteps.common.engine.sparse_task import SparseTask, SparseTrip, average_rows
from byteps.common.engine.stage import DONE, NOTHING, WAIT, Failure, Outcome, TaskFailed
from byteps.common.row_sparse import decode
from byteps.common.tensor_description import PartitionSpec
from byteps.transport import (
    FLAG_AVERAGE,
    FLAG_LOOKUP,
    FLAG_PULL,
    Command,
    Endpoint,
    Message,
    TransportError,
    command_name,
    json_payload,
)

__all__ = ["SparseExchange", "table_spec"]

log = logging.getLogger("byteps.common.engine.sparse_exchange")


def table_spec(task: SparseTask, server: int) -> PartitionSpec:
    """What INIT_KEY tells ``server`` about the task's table; every worker's must match the first."""
    table = task.table
    row_nbytes = int(np.prod(table.row_shape, dtype=np.int64)) * table.dtype.itemsize
    return PartitionSpec(name=table.name, partition=server, shape=(table.num_rows, *table.row_shape),
                         tensor_nbytes=table.num_rows * row_nbytes, nbytes=row_nbytes, dtype=int(table.dtype),
                         sparse=True, held=table.held.wire() if table.held is not None else None,
                         asynchronous=table.asynchronous)


class SparseExchange:
    """The sparse trips at SPARSE_EXCHANGE on this worker's server connections, and their merge."""

    def __init__(self, connections: List[Endpoint], rank: int) -> None:
        self.connections = connections
        self.rank = rank
        self._initialized: Set[int] = set()
        self._in_flight: Dict[Tuple[int, int], SparseTrip] = {}  # (key, round) pushed, answer not back
        self._lookups: Dict[Tuple[int, int], SparseTrip] = {}  # (key, lookup round) asked, answer not back
        self._abandoned: Set[Tuple[int, int]] = set()  # failed trips whose answers or complaints may still come

    def runners(self):
        return {Stage.SPARSE_EXCHANGE: self.exchange, Stage.SPARSE_MERGE: self.merge}

    # --- the stages ---------------------------------------------------------------------
    def exchange(self, trip: SparseTrip) -> Outcome:
        task, shard = trip.task, trip.part
        connection = self.connections[shard.server]
        if shard.key not in self._initialized:
            spec = table_spec(task, shard.server)
            connection.send(Command.INIT_KEY, self.rank, shard.key, payload=json_payload(spec.to_json()))
            self._initialized.add(shard.key)
        trip.data = []  # the answer's parts, as they come
        if task.lookup:
            round_ = task.round + shard.index
            self._lookups[(shard.key, round_)] = trip
            connection.send(Command.PULL, self.rank, shard.key, round_, payload=shard.payloads[0],
                            dtype=int(task.table.dtype), flags=FLAG_LOOKUP, aux=task.control)
            return WAIT
        self._in_flight[(shard.key, task.round)] = trip
        average = FLAG_AVERAGE if task.average else 0
        count = len(shard.payloads)
        for index, payload in enumerate(shard.payloads):
            connection.send(Command.PUSH, self.rank, shard.key, task.round, payload=payload,
                            dtype=int(task.table.dtype), flags=average | (FLAG_PULL if index == count - 1 else 0),
                            aux=count)
        return WAIT

    def merge(self, trip: SparseTrip) -> Outcome:
        """The trip's answer joins its task's; the last one makes the result."""
        task = trip.task
        task.answers[trip.part.index if task.lookup else trip.part.server] = trip.data
        if len(task.answers) < len(task.plan.partitions):
            return DONE
        if task.lookup:
            parts = [part for index in sorted(task.answers) for part in task.answers[index]]
            task.answers.clear()
            if task.control:  # every server saved or loaded its shard: nothing to put together
                return DONE
            ids = np.concatenate([part[0] for part in parts])
            asked = np.concatenate([shard.payloads[0] for shard in task.plan.partitions])
            order = np.argsort(ids, kind="stable")  # each server's rows ascending: in id order, then as asked
            if not np.array_equal(ids[order], np.sort(asked)):
                raise TaskFailed(TransportError(f"lookup of {task.table.describe()}: the servers answered "
                                                f"{len(ids)} rows for {len(asked)} ids asked, or other ids"))
            task.result.rows = np.concatenate([part[1] for part in parts])[order][task.inverse]
            return DONE
        # each server's answer: its parts, ascending; the servers' ids are disjoint
        parts = [part for server in sorted(task.answers) for part in task.answers[server]]
        ids = np.concatenate([part[0] for part in parts])
        rows = np.concatenate([part[1] for part in parts])  # a copy out of the received messages
        if len(task.answers) > 1:
            order = np.argsort(ids, kind="stable")
            ids, rows = ids[order], rows[order]
        task.result.ids, task.result.rows = ids, average_rows(rows, task.average_over, task.table.dtype)
        task.answers.clear()
        return DONE

    # --- what the servers send ----------------------------------------------------------
    def receive(self, message: Message, connection: Endpoint) -> Any:
        """One message about a sparse key (the dense exchange received it): the events it makes."""
        header = message.header
        entry = (header.key, header.round)
        if header.flags & FLAG_LOOKUP:
            return self._lookup_answer(message, connection, entry)
        if entry in self._abandoned:
            return NOTHING  # about a push_pull that has failed already
        trip = self._in_flight.get(entry)
        if header.command == Command.PUSH_ACK:
            return NOTHING  # no credit to return
        if header.command == Command.ERROR:
            if trip is None:  # a round this worker has not pushed yet: the server refuses the push when it comes
                return NOTHING
            text = message.text("")
            # Relayed to the servers (tell_servers): a rank that agreed with the table's first declaration
            # learns from them that this round is off, instead of waiting for it; and to this machine's other
            # ranks, which wait for this root's result (sparse_local).
            return [Failure(trip.task, TransportError(f"server {connection.address}: {text}"))]
        if header.command != Command.PULL_RESPONSE or trip is None:
            raise TransportError(f"unexpected {command_name(header.command)} for row-sparse key {header.key} "
                                 f"round {header.round} from server {connection.address}")
        return self._take_part(trip, message, connection, self._in_flight, entry)

    @staticmethod
    def _take_part(trip: SparseTrip, message: Message, connection: Endpoint,
                   waiting: Dict[Tuple[int, int], SparseTrip], entry: Tuple[int, int]) -> Any:
        """One PULL_RESPONSE of the answer ``trip`` waits for (in ``waiting`` under ``entry``): the trip once
        its last part is in."""
        table = trip.task.table
        try:
            trip.data.append(decode(message.payload, table.row_shape, table.dtype))
        except ValueError as exc:
            return [Failure(trip.task, TransportError(f"server {connection.address}: {exc}"))]
        if len(trip.data) < max(message.header.aux, 1):
            return NOTHING  # more parts of the answer to come
        del waiting[entry]
        return [trip]

    def _lookup_answer(self, message: Message, connection: Endpoint, entry: Tuple[int, int]) -> Any:
        """A part of a lookup's answer (FLAG_LOOKUP), or the server's refusal of it."""
        trip = self._lookups.get(entry)
        if trip is None:
            return NOTHING  # a failed lookup's
        header = message.header
        if header.command == Command.ERROR:
            return [Failure(trip.task, TransportError(f"server {connection.address}: {message.text('')}"))]
        return self._take_part(trip, message, connection, self._lookups, entry)

    # --- failures -----------------------------------------------------------------------
    def abandon(self, task: Any) -> None:
        """Forget a failed task's trips; what still comes about them is dropped."""
        if task.__class__ is not SparseTask:
            return
        if task.lookup:
            for shard in task.plan.partitions:
                self._lookups.pop((shard.key, task.round + shard.index), None)
            return
        for shard in task.plan.partitions:
            entry = (shard.key, task.round)
            self._in_flight.pop(entry, None)
            self._abandoned.add(entry)
