"""A row-sparse push_pull inside the engine: one task, one trip per server, on a sparse route.

The caller's (ids, rows) of a table become a :class:`SparseTask`
(:class:`SparseTasks` checks them on the calling rank and sums the rows of
duplicate ids). With one worker process per machine the rows are cut by
server at once (:func:`~byteps.common.row_sparse.server_of`): each server's
share is a :class:`SparseShard` and travels as a :class:`SparseTrip` along
the sparse route (SPARSE_EXCHANGE, SPARSE_MERGE) through the same
dispatcher, task table and failure fan-out as a dense partition. With
several processes per machine the table's *local root* sums the machine's
rows first (:mod:`byteps.common.engine.sparse_local`): its trips cut the
machine's sum by server at SPARSE_LOCAL_SUM, and another local rank's one
trip only hands its rows to the root and takes the result back. Why not
the dense routes: a dense partition is a fixed window of the caller's
tensor, received in place, where a sparse answer's size is known only when
it arrives (docs/sparse.md).

Every call, good or bad, takes the table's next round on this rank, so
that every rank numbers the table's rounds alike: a call refused here
(ids out of range, another row shape...) raises ValueError on the caller
and still fails its round on the servers, where the other ranks learn of
it instead of waiting for this rank's push.

A server-held table in an asynchronous job (BYTEPS_ENABLE_ASYNC) is the
exception: nobody waits for anybody's round there, so every process
pushes its own rows (role ALONE, no local sum that would pace a machine's
processes together), each push is applied on arrival, and a refused call
tells no one (the process's next round simply comes later).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import zlib
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from byteps.common.dtypes import DType
from byteps.common.engine.route import Role, sparse_route
from byteps.common.handle import Handle
from byteps.common.row_sparse import (
    SparseRows,
    SparseTable,
    encode_chunks,
    narrow,
    server_of,
    sparse_key,
    sum_by_id,
    table_layout,
    widen,
)

__all__ = ["HELD_TABLE_IDS", "held_table_id", "SparseHandle", "SparseShard", "SparsePlan", "SparseTask",
           "SparseTasks", "SparseTrip", "average_over", "average_rows", "cut_by_server", "empty_shards", "local_root",
           "trips_of"]


#: Table ids from here up are server-held tables' (:func:`held_table_id`); the others count up from 0.
HELD_TABLE_IDS = 1 << 31


def held_table_id(name: str) -> int:
    """A server-held table's id, from its name alone (two names that hash alike are told apart by the servers,
    which refuse the second one's declaration naming both)."""
    return HELD_TABLE_IDS | zlib.crc32(name.encode()) & (HELD_TABLE_IDS - 1)


def local_root(table_id: int, local_size: int) -> int:
    """The local rank that sums a table's rows on each machine: tables spread over the machine's processes."""
    return table_id % local_size


@dataclasses.dataclass(eq=False)
class SparseShard:
    """The rows of one round that one server sums: the key of the table on that server, and the payloads (one
    message each, at most BYTEPS_PARTITION_BYTES: the records cut in order, :func:`encode_chunks`)."""

    key: int
    index: int  # the server: a trip's "partition" for the tracer
    server: int
    payloads: List[Optional[np.ndarray]]  # encoded (id, row) records; [None] for none


@dataclasses.dataclass(eq=False)
class SparsePlan:
    """What the task table and the failure fan-out read of a task's plan: its shards as its partitions."""

    tensor_id: int  # the table's id
    partitions: List[SparseShard]
    nbytes: int  # bytes pushed


@dataclasses.dataclass(eq=False)
class SparseTask:
    """One row-sparse push_pull of one table, on its way to the servers and back."""

    name: str
    round: int
    table: SparseTable
    plan: SparsePlan
    handle: Handle
    result: Optional[SparseRows] = None  # what the handle returns: filled in by SPARSE_MERGE
    average: bool = False
    average_over: int = 0  # 0 for a sum, else the number of workers to divide by
    refusal: Optional[BaseException] = None  # refused on this rank: the engine only fails the round elsewhere
    lookup: bool = False  # a server-held table's rows looked up by id (each shard one PULL), outside its rounds
    inverse: Optional[np.ndarray] = None  # a lookup: where each id the caller gave is among the unique ones
    control: int = 0  # a lookup that asks each server to save or load its shard (held_table.SAVE, LOAD)
    role: Role = Role.ALONE  # ALONE (one process per machine), ROOT (sums the machine's rows) or PEER
    mine: Optional[Tuple[np.ndarray, np.ndarray]] = None  # ROOT and PEER: this rank's rows, summed by id
    summed: bool = False  # ROOT: the machine's rows are summed and cut by server
    answered: bool = False  # ROOT: the result went to the other local ranks
    absent: Tuple[int, ...] = ()  # ROOT: local ranks that had joined (hvd.join()) and sent no rows: no answer
    # server -> its answer's (ids, rows) parts
    answers: Dict[int, List[Tuple[np.ndarray, np.ndarray]]] = dataclasses.field(default_factory=dict)
    # --- what the task table, dispatcher and failures read, as of a PushPullTask ---
    stand_in: bool = False
    skipped: bool = False
    started: float = 0.0
    remaining: int = 0
    network_partitions: int = 0
    failed: bool = False
    closed_after: Optional[int] = None

    def spans_machines(self) -> bool:
        return True


class SparseTrip:
    """One server's share of a sparse task on the sparse route; an event that delivers itself (the
    dispatcher's fast path knows PartitionTrip only)."""

    __slots__ = ("task", "part", "route", "stages", "position", "data", "stage_started", "sent_at")

    def __init__(self, task: SparseTask, shard: SparseShard, route: Any) -> None:
        self.task = task
        self.part = shard
        self.route = route
        self.stages = route.stages
        self.position = -1
        self.data: Any = None  # SPARSE_EXCHANGE: the (ids, rows) parts of the server's answer, in order
        self.stage_started = 0.0
        self.sent_at = 0.0

    def deliver(self, dispatcher: Any) -> None:
        dispatcher.advance(self)


def trips_of(task: SparseTask, servers: bool) -> List[SparseTrip]:
    """A task's trips, one per shard, on the route of its role (with or without servers)."""
    route = sparse_route(task.role, servers)
    return [SparseTrip(task, shard, route) for shard in task.plan.partitions]


class SparseHandle(Handle):
    """A row-sparse push_pull's handle: frees its table for the next round before anyone waiting wakes."""

    def __init__(self, table: SparseTable, result: SparseRows) -> None:
        super().__init__(table.name, result)
        self._table = table

    def set_done(self) -> None:
        self._table.in_flight = False
        super().set_done()

    def set_error(self, error: BaseException) -> None:
        self._table.in_flight = False
        super().set_error(error)


def average_over(average: bool, held: Any, size: int) -> int:
    """What a worker divides a round's sum by: the ``size`` workers where the call averages, except for a
    server-held table, whose servers divide before they apply (0: nothing to divide)."""
    return size if average and held is None else 0


def average_rows(rows: np.ndarray, divisor: int, dtype: DType) -> np.ndarray:
    """``rows`` (of ``dtype``) divided by ``divisor``, in place where their dtype allows (float16 and bfloat16
    are divided in float32, then rounded once)."""
    if divisor <= 1:
        return rows
    if dtype in (DType.FLOAT16, DType.BFLOAT16):
        return narrow(widen(rows, dtype) / divisor, dtype)
    return np.divide(rows, divisor, out=rows)


class SparseTasks:
    """This rank's row-sparse tables and the tasks made of their calls.

    ``num_servers`` 0: no servers (one machine: its local ranks sum the
    rows; a single worker process: the result is made here). ``submit(task)``
    hands a task to the communication thread (None for a single process).
    ``local_rank`` and ``local_size``: this process on its machine.
    ``asynchronous``: the job's BYTEPS_ENABLE_ASYNC (server-held tables only).
    """

    def __init__(self, num_servers: int, size: int, max_payload_bytes: int,
                 submit: Optional[Callable[[SparseTask], None]], local_rank: int = 0, local_size: int = 1,
                 asynchronous: bool = False) -> None:
        self.num_servers = num_servers
        self.asynchronous = asynchronous  # BYTEPS_ENABLE_ASYNC: held tables' updates applied on arrival
        self.size = size
        self.max_payload_bytes = max_payload_bytes
        self.submit = submit
        self.local_rank, self.local_size = local_rank, local_size
        self.tables: Dict[str, SparseTable] = {}
        self._lock = threading.Lock()

    def make(self, ids: Any, rows: Any, name: str, num_rows: Any, row_shape: Any, average: bool,
             dtype: Any = None, held: Any = None) -> Handle:
        """Start a row-sparse push_pull; ValueError for bad input (its round fails on the other ranks too).
        ``dtype``: the rows' dtype where their array does not say it (``"bfloat16"`` over 16-bit storage).
        ``held``: the table lives on the servers (a :class:`~byteps.common.held_table.HeldTable`): the rows are
        its gradients, which the servers apply; the result has no rows."""
        with self._lock:
            table = self._table(name, held)
            if table.in_flight:
                raise ValueError(f"{table.describe()} has a push_pull in flight: wait for it first")
            round_ = table.rounds
            table.rounds += 1
            role = self._role(table, held)
            try:
                self._check_held(table, held)
                ids, rows = sum_by_id(*self._checked(table, ids, rows, num_rows, row_shape, dtype), table.dtype)
                if held is not None and table.dtype is not DType.FLOAT32:
                    raise ValueError(f"{table.describe()}: a server-held table's gradients are float32")
                if role is Role.ALONE:
                    shards, pushed = cut_by_server(table, ids, rows, self.num_servers, self.max_payload_bytes)
                else:  # the local root cuts the machine's sum once it has it
                    shards, pushed = empty_shards(table.table_id, role, self.num_servers), ids.nbytes + rows.nbytes
            except ValueError as exc:
                if not self._applied_on_arrival(held):  # else nobody waits for this round
                    self._refuse(table, round_, role, exc)
                raise
            result = SparseRows(ids, rows)
            handle = SparseHandle(table, result)
            if self.submit is None:  # a single worker process: its rows are the round's sum and average
                handle.set_done()
                return handle
            table.in_flight = True
            if held is not None:
                table.last_update = handle
        self.submit(SparseTask(table.name, round_, table, SparsePlan(table.table_id, shards, pushed), handle,
                               result, average=average, average_over=average_over(average, held, self.size), role=role,
                               mine=None if role is Role.ALONE else (ids, rows)))
        return handle

    def lookup(self, ids: Any, name: str, num_rows: Any, row_shape: Any, held: Any) -> Handle:
        """Start a lookup of rows ``ids`` (any order, repeats allowed) of the server-held table ``name``; the
        handle's ``wait()`` returns a :class:`~byteps.common.row_sparse.SparseRows` of ``ids`` and their rows.
        Each process asks the servers itself, for each row once, outside the table's rounds; ValueError on this
        rank alone for bad input."""
        with self._lock:
            table = self._held_table(name, num_rows, row_shape, held)
            asked = table.check_ids(ids)
            ids, inverse = np.unique(asked, return_inverse=True)
            owners = server_of(ids, self.num_servers)
            per_message = max(self.max_payload_bytes // 8, 1) if self.max_payload_bytes else max(len(ids), 1)
            shards = []
            for server in range(self.num_servers):
                mine = ids[owners == server]
                for start in range(0, max(len(mine), 1), per_message):
                    shards.append(SparseShard(sparse_key(table.table_id, server), len(shards), server,
                                              [mine[start:start + per_message]]))
        result = SparseRows(asked, np.empty((0, *table.row_shape), np.float32))
        return self._ask(table, shards, ids.nbytes, result, inverse=inverse.reshape(-1))

    def control(self, op: int, directory: str, name: str, num_rows: Any, row_shape: Any, held: Any) -> Handle:
        """Ask every server to save its shard of the held table ``name`` into ``directory`` (``op`` SAVE), or
        to take its rows from the shards saved there by any number of servers (LOAD); the handle is done when
        every server has. The directory is the servers' (a file system they share, or each its own)."""
        if held is None:
            raise ValueError(f"table {name!r}: only a table held by the servers is saved or loaded there")
        with self._lock:
            table = self._held_table(name, num_rows, row_shape, held)
            payload = np.frombuffer(json.dumps({"directory": str(directory), "servers": self.num_servers}).encode(),
                                    np.uint8)
            shards = [SparseShard(sparse_key(table.table_id, server), server, server, [payload])
                      for server in range(self.num_servers)]
        return self._ask(table, shards, 0, None, control=op)

    def _held_table(self, name: Any, num_rows: Any, row_shape: Any, held: Any) -> SparseTable:
        """The held table ``name`` declared with this layout (at its first use) or checked against it."""
        table = self._table(name, held)
        self._check_held(table, held)
        layout = table_layout(num_rows, row_shape, DType.FLOAT32)
        if table.num_rows == 0:
            table.num_rows, table.row_shape, table.dtype = layout
        elif not table.same_layout(*layout):
            raise ValueError(f"{table.describe()} used with {num_rows} rows of shape {row_shape}: a table keeps its "
                             "rows and row shape")
        return table

    def _ask(self, table: SparseTable, shards: List[SparseShard], nbytes: int, result: Any, **kind: Any) -> Handle:
        """Submit a request of ``table``'s servers outside its rounds (a lookup, a save, a load), one message per
        shard, each with a round number of the table's lookups (a server may get several)."""
        with self._lock:
            round_ = table.lookups
            table.lookups += len(shards)
        handle = Handle(table.name, result)
        self.submit(SparseTask(table.name, round_, table, SparsePlan(table.table_id, shards, nbytes), handle,
                               result, lookup=True, **kind))
        return handle

    def _table(self, name: Any, held: Any) -> SparseTable:
        """The table ``name``, made at its first use (refused or not). A table on the workers is numbered by
        first use, the same on every rank since every rank pushes every round; a server-held one is looked up
        by one rank alone at times (an evaluation), so its id comes from its name (:func:`held_table_id`)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a row-sparse table needs a non-empty name, not {name!r}")
        table = self.tables.get(name)
        if table is None:
            table_id = held_table_id(name) if held is not None else \
                sum(1 for known in self.tables.values() if known.table_id < HELD_TABLE_IDS)
            table = self.tables[name] = SparseTable(name, table_id, 0, (), DType.FLOAT32)
        return table

    def _check_held(self, table: SparseTable, held: Any) -> None:
        """A table is held by the servers or not, with one optimizer, from its first use on."""
        if held is not None and not self.num_servers:
            raise ValueError(f"{table.describe()}: a table held by the servers needs servers (bpslaunch --servers N "
                             "or DMLC_NUM_SERVER); without them keep the table in the model")
        if table.num_rows == 0:  # not declared yet
            table.held, table.asynchronous = held, self._applied_on_arrival(held)
        elif held != table.held:
            was = table.held.describe() if table.held is not None else "rows on the workers"
            now = held.describe() if held is not None else "rows on the workers"
            raise ValueError(f"{table.describe()}: first used with {was}, now with {now}; a table keeps how it is "
                             "held")

    def held_tables(self) -> List[SparseTable]:
        """The server-held tables this rank declared (an elastic commit saves them)."""
        with self._lock:
            return [table for table in self.tables.values() if table.held is not None and table.num_rows]

    def wait_for_updates(self, timeout: Optional[float] = None) -> None:
        """Wait until this rank's last update of every held table is applied (raises its error, if it failed)."""
        for table in self.held_tables():
            if table.last_update is not None:
                table.last_update.wait(timeout)

    # --- agreement after join -------------------------------------------------------------
    def export(self) -> Dict[str, Any]:
        """Every table this rank used, with its id, rounds and layout (JSON-able), for the others after a join."""
        with self._lock:
            return {name: [table.table_id, table.rounds, table.num_rows, list(table.row_shape), int(table.dtype)]
                    for name, table in self.tables.items()}

    def adopt(self, states: List[Dict[str, Any]]) -> None:
        """Take in every rank's :meth:`export`: tables this rank missed while it had joined (the others used
        them; ids go by first use, so they extend this rank's), and each table's furthest round (the servers
        counted a joined machine's missing pushes as empty ones)."""
        with self._lock:
            for state in states:
                for name, (table_id, rounds, num_rows, row_shape, dtype) in state.items():
                    table = self.tables.get(name)
                    if table is None:
                        table = self.tables[name] = SparseTable(name, table_id, num_rows, tuple(row_shape),
                                                                DType(dtype))
                    elif table.table_id != table_id:
                        raise RuntimeError(f"join: {table.describe()} has id {table.table_id} here and {table_id} "
                                           "on another rank; every rank must use the same tables in the same order")
                    elif table.num_rows == 0 and num_rows:  # first used here by a refused call
                        table.num_rows, table.row_shape, table.dtype = num_rows, tuple(row_shape), DType(dtype)
                    table.rounds = max(table.rounds, rounds)

    def _checked(self, table: SparseTable, ids: Any, rows: Any, num_rows: Any, row_shape: Any,
                 dtype: Any) -> Tuple[np.ndarray, np.ndarray]:
        rows = np.asarray(rows)
        layout = table_layout(num_rows, row_shape, rows.dtype if dtype is None else dtype)
        if layout[2] is DType.BFLOAT16 and rows.dtype != np.uint16:  # int16, or ml_dtypes' bfloat16
            if rows.dtype.itemsize != 2:
                raise ValueError(f"bfloat16 rows must be stored in 16 bits, not as {rows.dtype}")
            rows = rows.view(np.uint16)
        if table.num_rows == 0:
            table.num_rows, table.row_shape, table.dtype = layout
        elif not table.same_layout(*layout):
            given = SparseTable(table.name, table.table_id, *layout)
            raise ValueError(f"{given.describe()}: the name was first used for {table.describe()}; a table keeps "
                             "its rows, row shape and dtype")
        return table.check(ids, rows)

    def _refuse(self, table: SparseTable, round_: int, role: Role, error: BaseException) -> None:
        """Fail round ``round_`` of ``table`` where the other ranks wait for this one: on the servers (a local
        root's or a lone process's refusal: the other machines' pushes of it fail there) and this machine's
        other local ranks (a peer's goes to its root, which fails the round on the servers too)."""
        if self.submit is None:
            return
        shards = empty_shards(table.table_id, role, self.num_servers)
        handle = Handle(table.name, None)
        self.submit(SparseTask(table.name, round_, table, SparsePlan(table.table_id, shards, 0), handle,
                               refusal=error, role=role))

    def _applied_on_arrival(self, held: Any) -> bool:
        """A server-held table in an asynchronous job: each process's update is applied as it arrives."""
        return held is not None and self.asynchronous

    def _role(self, table: SparseTable, held: Any = None) -> Role:
        if self.local_size == 1 or self._applied_on_arrival(held):
            return Role.ALONE
        return Role.ROOT if local_root(table.table_id, self.local_size) == self.local_rank else Role.PEER



def empty_shards(table_id: int, role: Role, num_servers: int) -> List[SparseShard]:
    """Shards without rows yet: a lone process's or a root's one per server (a root's payloads are cut at
    SPARSE_LOCAL_SUM; a refused call sends none), a root's one without servers (the machine's sum is the
    result), a peer's one, the key its rows go to the root under."""
    if role is not Role.PEER and num_servers:
        return [SparseShard(sparse_key(table_id, s), s, s, [None]) for s in range(num_servers)]
    return [SparseShard(sparse_key(table_id, 0), 0, -1, [None])]


def cut_by_server(table: SparseTable, ids: np.ndarray, rows: np.ndarray, num_servers: int,
                  max_payload_bytes: int) -> Tuple[List[SparseShard], int]:
    """The rows of each server (by :func:`server_of`), encoded in payloads of at most ``max_payload_bytes``;
    and the bytes pushed in all."""
    if not num_servers:
        return [], 0
    owners = server_of(ids, num_servers)
    shards, pushed = [], 0
    for server in range(num_servers):
        mine = owners == server
        payloads = encode_chunks(ids[mine], rows[mine], max_payload_bytes, table.describe())
        pushed += sum(payload.nbytes for payload in payloads if payload is not None)
        shards.append(SparseShard(sparse_key(table.table_id, server), server, server, payloads))
    return shards, pushed
