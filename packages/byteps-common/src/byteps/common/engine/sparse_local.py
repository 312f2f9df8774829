"""A machine's row-sparse rows summed by id before they leave it: SPARSE_TO_ROOT, SPARSE_LOCAL_SUM, SPARSE_LOCAL_ANSWER.

With several worker processes on a machine, each row-sparse table has one
*local root* (:func:`~byteps.common.engine.sparse_task.local_root`: tables
spread over the local ranks). The other local ranks send it their rows
(already summed by id) over the local channel, the root sums the machine's
rows by id with its own, and only that sum goes to the servers: a
machine's NIC carries the unique rows its ranks touched once, and the
union once, as a dense partition crosses it once per machine
(:mod:`byteps.common.engine.local`). Without servers (one machine) the
machine's sum is the round's result. The routes
(:data:`~byteps.common.engine.route.SPARSE_ROUTES`):

* another local rank: SPARSE_TO_ROOT (its rows to the root, in messages of
  whole records, the last flagged; then wait for the result);
* the root: SPARSE_LOCAL_SUM (once every other rank's rows are in, the sum
  cut by server into its trips' payloads), SPARSE_EXCHANGE and
  SPARSE_MERGE with the servers, SPARSE_LOCAL_ANSWER (the result, averaged
  where asked, to the others); without servers SPARSE_LOCAL_SUM makes the
  result itself.

The messages are PUSH (rows to the root: ``aux`` parts, FLAG_PULL on the
last, FLAG_AVERAGE where the call averages) and PULL_RESPONSE (the result,
the same way) on a key of the table
(:func:`~byteps.common.row_sparse.sparse_key` of server 0), never a dense
tensor's. A rank's first round of a table first sends INIT_KEY with the
table's layout (name, id, rows, row shape, dtype, how it is held), which
the root compares with its own. ERROR fails the round: a peer's refusal or
failure at its root (which fails it on the servers too), the root's at
every peer.

Joined ranks (Horovod's ``hvd.join()``, :mod:`~byteps.common.engine.local_join`):
a root counts a local rank that joined and sent no rows as no rows (and
sends it no answer), as a server counts a joined machine. A root that
joined *stands in*: for a round its peers push and it never started, it
makes a task of its own with no rows (the table from the peers' layout),
which sums theirs, goes to the servers as the machine's push and answers
them. Rows from a rank that joined come only after every rank joined
(join returns then): such a round waits for everybody.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Set, Tuple

import numpy as np

from byteps.common.dtypes import DType
from byteps.common.engine.local_channel import MAX_PAYLOAD_BYTES
from byteps.common.engine.route import Role, Stage
from byteps.common.engine.sparse_task import (
    SparsePlan,
    SparseTask,
    SparseTrip,
    average_over,
    average_rows,
    cut_by_server,
    empty_shards,
    local_root,
    trips_of,
)
from byteps.common.engine.stage import DONE, NOTHING, WAIT, Failure, Outcome, RoundRefused, TaskFailed
from byteps.common.handle import Handle
from byteps.common.held_table import HeldTable
from byteps.common.row_sparse import (
    SparseRows,
    SparseTable,
    decode,
    encode_chunks,
    sparse_key,
    sum_by_id,
    table_of_key,
)
from byteps.transport import (
    FLAG_AVERAGE,
    FLAG_PULL,
    Command,
    TransportError,
    command_name,
    json_payload,
    parse_json_payload,
)

__all__ = ["SparseLocal"]

log = logging.getLogger("byteps.common.engine.sparse_local")

Entry = Tuple[int, int]  # (the table's local key, round)


class _Rows:
    """One local rank's rows of a round as they come, in parts."""

    __slots__ = ("parts", "count")

    def __init__(self, count: int) -> None:
        self.parts: List[Any] = []  # the messages, decoded at the sum
        self.count = count

    @property
    def complete(self) -> bool:
        return len(self.parts) >= self.count


class SparseLocal:
    """This process's side of the machine's row-sparse sums: its rows to the roots, its tables' sums as root.

    ``size``: the job's worker processes (a stand-in's average); ``joins``: the machine's
    :class:`~byteps.common.engine.local_join.JoinedRanks` (None: no join to count).
    """

    def __init__(self, channel: Any, local_rank: int, local_size: int, num_servers: int,
                 max_payload_bytes: int, size: int = 1, joins: Any = None) -> None:
        self.channel = channel
        self.local_rank, self.local_size = local_rank, local_size
        self.size, self.joins = size, joins
        self.num_servers = num_servers
        self.max_payload_bytes = max_payload_bytes  # for the servers' payloads
        # parts on the local channel: at most its message limit
        self.limit = min(max_payload_bytes, MAX_PAYLOAD_BYTES) if max_payload_bytes else MAX_PAYLOAD_BYTES
        self._rows: Dict[Entry, Dict[int, _Rows]] = {}  # root: the other ranks' rows, by local rank
        self._summing: Dict[Entry, List[SparseTrip]] = {}  # root: its trips at SPARSE_LOCAL_SUM
        self._answering: Dict[Entry, SparseTrip] = {}  # peer: its trip, waiting for the result
        self._answers: Dict[Entry, _Rows] = {}  # peer: the result's parts as they come
        self._failed: Dict[Entry, BaseException] = {}  # failed by a local rank before this rank's task came
        self._layouts: Dict[int, Dict[int, Any]] = {}  # root: the table's layout as each other rank declared it
        self._declared: Set[int] = set()  # peer: the tables whose layout went to their root
        self._abandoned: Set[Entry] = set()  # failed rounds whose messages may still come
        self._stood_in: Set[Entry] = set()  # joined root: rounds it started a stand-in for

    def runners(self):
        return {Stage.SPARSE_TO_ROOT: self.to_root, Stage.SPARSE_LOCAL_SUM: self.local_sum,
                Stage.SPARSE_LOCAL_ANSWER: self.answer}

    # --- the stages ---------------------------------------------------------------------
    def to_root(self, trip: SparseTrip) -> Outcome:
        """SPARSE_TO_ROOT: this rank's rows to the table's root (the layout first, once); wait for the result."""
        task = trip.task
        entry = (trip.part.key, task.round)
        failed = self._failed.pop(entry, None)
        if failed is not None:
            raise TaskFailed(failed, tell_peers=False)
        root = local_root(task.table.table_id, self.local_size)
        table = task.table
        if trip.part.key not in self._declared:
            self._declared.add(trip.part.key)
            self.channel.send(root, Command.INIT_KEY, trip.part.key, task.round,
                              payload=json_payload(_layout(task)))
        ids, rows = task.mine
        payloads = _cut(ids, rows, self.limit, table.describe())
        average = FLAG_AVERAGE if task.average else 0  # a joined root standing in averages as the call does
        for index, payload in enumerate(payloads):
            self.channel.send(root, Command.PUSH, trip.part.key, task.round, len(payloads), int(table.dtype),
                              average | (FLAG_PULL if index == len(payloads) - 1 else 0), payload)
        self._answering[entry] = trip
        return self._answer_if_complete(entry)

    def local_sum(self, trip: SparseTrip) -> Outcome:
        """SPARSE_LOCAL_SUM (root): once every other local rank's rows are in, the machine's sum, cut by server
        into this task's trips (without servers: the result)."""
        task = trip.task
        if task.summed:
            return DONE
        entry = (_key_of(task), task.round)
        failed = self._failed.pop(entry, None)
        if failed is not None:  # a local rank failed this round: the servers and the other ranks learn of it
            raise TaskFailed(failed)
        # The task's trips all come here in one go (the engine starts them together, before any message is
        # read): either the first finds every peer's rows in and sums, and the others find the task summed,
        # or all wait and the message that completes the rows releases them all (_progress).
        self._summing.setdefault(entry, []).append(trip)
        return DONE if self._sum_if_complete(entry) else WAIT

    def answer(self, trip: SparseTrip) -> Outcome:
        """SPARSE_LOCAL_ANSWER (root): the result to the other local ranks, once (by the trip that made it)."""
        task = trip.task
        if task.answered or task.answers:  # sent already, or SPARSE_MERGE waits for more servers' answers
            return DONE
        task.answered = True
        payloads = _cut(task.result.ids, task.result.rows, self.limit, task.table.describe())
        key = _key_of(task)
        for rank in range(self.local_size):
            if rank == self.local_rank or rank in task.absent:  # a joined rank waits for no answer
                continue
            for index, payload in enumerate(payloads):
                self.channel.send(rank, Command.PULL_RESPONSE, key, task.round, len(payloads), int(task.table.dtype),
                                  FLAG_PULL if index == len(payloads) - 1 else 0, payload)
        return DONE

    # --- messages from the other local ranks ------------------------------------------------
    def receive(self, message: Any):
        """One message about a row-sparse table from a local peer: the events it causes."""
        header = message.header
        entry = (header.key, header.round)
        command = header.command
        if entry in self._abandoned:
            return NOTHING  # about a round that failed here already
        if command == Command.INIT_KEY:
            self._layouts.setdefault(header.key, {})[header.sender] = parse_json_payload(message.payload)
            return NOTHING
        if command == Command.PUSH:
            if self.joins is not None:
                self.joins.ready_from(header.sender, entry)  # a joined rank's rows: a round after every rank joined
            rows = self._rows.setdefault(entry, {}).get(header.sender)
            if rows is None:
                rows = self._rows[entry][header.sender] = _Rows(max(header.aux, 1))
            rows.parts.append(message)  # decoded at the sum, against the root's own table
            if not rows.complete:
                return NOTHING
            return self._progress(entry)
        if command == Command.PULL_RESPONSE:
            answer = self._answers.setdefault(entry, _Rows(max(header.aux, 1)))
            answer.parts.append(message)
            trip = self._answering.get(entry)
            try:
                return [trip] if self._answer_if_complete(entry) is DONE else NOTHING
            except TaskFailed as failed:
                return [Failure(trip.task, failed.error, failed.tell_peers)]
        if command == Command.ERROR:
            text = message.text()
            return self._failure(entry, TransportError(f"local rank {header.sender}: {text}"))
        log.error("unexpected %s for a row-sparse table from local rank %d", command_name(command), header.sender)
        return NOTHING

    def _progress(self, entry: Entry):
        trips = self._summing.get(entry)
        if not trips:
            if self._stands_in(entry):
                return self._stand_in(entry)
            return NOTHING  # the root's own call of this round has not come yet
        try:
            done = self._sum_if_complete(entry)
        except TaskFailed as failed:
            return [Failure(trips[0].task, failed.error)]
        return list(trips) if done else NOTHING

    def _failure(self, entry: Entry, error: BaseException):
        trip = self._answering.get(entry) or next(iter(self._summing.get(entry, ())), None)
        if trip is None:
            self._failed[entry] = error
            return NOTHING
        # A peer's failure at its root: the root fails the round on the servers too (and at its other peers).
        return [Failure(trip.task, error, tell_peers=trip.task.role is Role.ROOT)]

    # --- joined ranks ---------------------------------------------------------------------
    def revisit(self):
        """A local rank joined (this one, or a peer): the sums that waited for it, and the stand-ins to start."""
        events: List[Any] = []
        for entry in list(self._summing):
            events.extend(self._progress(entry))
        for entry in list(self._rows):
            if entry not in self._summing:
                events.extend(self._progress(entry))
        return events

    def _stands_in(self, entry: Entry) -> bool:
        """This rank joined, its peers push a round of a table it roots, and nobody else will sum it."""
        joins = self.joins
        return (joins is not None and joins.joining and entry in self._rows and entry not in self._stood_in
                and entry not in joins.after_join)

    def _stand_in(self, entry: Entry):
        """A task with no rows of this rank's own for a round its peers push to it after it joined: it sums
        theirs, pushes the machine's sum and answers them, as its own call would have."""
        key, round_ = entry
        self._stood_in.add(entry)
        layout = next(iter(self._layouts.get(key, {}).values()), None)
        if layout is None:  # not expected: a peer's first round of a table declares it first
            text = f"row-sparse key {key}: local rank {self.local_rank} joined and knows no layout of its table"
            for rank in self._rows.get(entry, {}):
                self.channel.send(rank, Command.ERROR, key, round_, payload=text.encode())
            table_id = table_of_key(key)  # the other machines wait for this one's push on every server
            return [RoundRefused(sparse_key(table_id, server), round_, server, RuntimeError(text))
                    for server in range(self.num_servers)]
        table = SparseTable(layout["name"], int(layout["table_id"]), int(layout["rows"]), tuple(layout["row_shape"]),
                            DType[layout["dtype"].upper()],
                            held=HeldTable.from_wire(layout["held"]) if layout.get("held") else None)
        first = next(iter(self._rows[entry].values())).parts[0]
        average = bool(first.header.flags & FLAG_AVERAGE)
        nothing = (np.empty(0, np.int64), np.empty((0, *table.row_shape), table.dtype.storage))
        task = SparseTask(table.name, round_, table,
                          SparsePlan(table.table_id, empty_shards(table.table_id, Role.ROOT, self.num_servers), 0),
                          Handle(table.name, None), SparseRows(*nothing), average=average,
                          average_over=average_over(average, table.held, self.size), role=Role.ROOT,
                          mine=nothing, stand_in=True)
        return [SparseStandIn(task, trips_of(task, bool(self.num_servers)))]

    # --- the root's sum, the peer's result ---------------------------------------------------
    def _sum_if_complete(self, entry: Entry) -> bool:
        """The machine's sum of ``entry`` once every other local rank's rows are in (a rank that joined and sent
        none counts as no rows); False: not yet."""
        trips = self._summing[entry]
        task = trips[0].task
        rows_of = self._rows.get(entry, {})
        missing = tuple(rank for rank in range(self.local_size)
                        if rank != self.local_rank and not (rank in rows_of and rows_of[rank].complete))
        if missing:
            joins = self.joins
            if (joins is None or entry in joins.after_join or any(rank in rows_of for rank in missing)
                    or any(rank not in joins.joined for rank in missing)):
                return False
            task.absent = missing
        del self._summing[entry]
        self._stood_in.discard(entry)
        self._rows.pop(entry, None)
        table = task.table
        self._check_layouts(task, entry[0], rows_of)
        ids, rows = [task.mine[0]], [task.mine[1]]
        for rank in sorted(rows_of):
            for message in rows_of[rank].parts:
                if message.header.dtype != int(table.dtype):
                    raise TaskFailed(ValueError(f"{table.describe()}: local rank {rank} pushes rows of another "
                                                f"dtype (byteps dtype {message.header.dtype}); every rank must "
                                                "push the same table"))
                try:
                    part_ids, part_rows = decode(message.payload, table.row_shape, table.dtype)
                except ValueError as exc:
                    raise TaskFailed(ValueError(f"{table.describe()}: local rank {rank}: {exc}")) from None
                if len(part_ids) and (part_ids.min() < 0 or part_ids.max() >= table.num_rows):
                    raise TaskFailed(ValueError(f"{table.describe()}: local rank {rank} pushes row ids outside "
                                                f"[0, {table.num_rows})"))
                ids.append(part_ids)
                rows.append(part_rows)
        summed_ids, summed_rows = sum_by_id(np.concatenate(ids), np.concatenate(rows), table.dtype)
        task.summed = True
        if not self.num_servers:  # one machine: its sum is the round's result
            task.result.ids = summed_ids
            task.result.rows = average_rows(summed_rows, task.average_over, table.dtype)
            return True
        try:
            shards, pushed = cut_by_server(table, summed_ids, summed_rows, self.num_servers, self.max_payload_bytes)
        except ValueError as exc:  # a single record larger than a message
            raise TaskFailed(exc) from None
        for shard in shards:
            task.plan.partitions[shard.server].payloads = shard.payloads
        task.plan.nbytes = pushed
        return True

    def _check_layouts(self, task: SparseTask, key: int, rows_of: Dict[int, _Rows]) -> None:
        """Every other local rank declared the table as this rank uses it (on its first round); else TaskFailed."""
        mine = _layout(task)
        layouts = self._layouts.get(key, {})
        for rank in rows_of:
            theirs = layouts.get(rank)
            if theirs is not None and theirs != mine:
                raise TaskFailed(ValueError(
                    f"mismatch for row-sparse table {task.table.name!r}: local rank {rank} uses {theirs['rows']} "
                    f"rows of shape {tuple(theirs['row_shape'])} ({theirs['dtype']}), local rank {self.local_rank} "
                    f"{mine['rows']} of shape {tuple(mine['row_shape'])} ({mine['dtype']}); every rank must use a "
                    "table name with the same layout"))

    def _answer_if_complete(self, entry: Entry) -> Optional[Outcome]:
        """A peer's result once every part of it came (None: not yet, or its task has not come)."""
        trip = self._answering.get(entry)
        answer = self._answers.get(entry)
        if trip is None or answer is None or not answer.complete:
            return WAIT if trip is not None else None
        del self._answering[entry], self._answers[entry]
        task, table = trip.task, trip.task.table
        try:
            parts = [decode(message.payload, table.row_shape, table.dtype) for message in answer.parts]
        except ValueError as exc:
            raise TaskFailed(ValueError(f"{table.describe()}: the local root's result: {exc}"),
                             tell_peers=False) from None
        task.result.ids = np.concatenate([part[0] for part in parts])
        task.result.rows = np.concatenate([part[1] for part in parts])  # a copy out of the messages
        return DONE

    # --- failures -----------------------------------------------------------------------
    def abandon(self, task: SparseTask) -> None:
        """Forget a failed task: what still comes about its round is dropped."""
        entry = (_key_of(task), task.round)
        self._abandoned.add(entry)
        self._summing.pop(entry, None)
        self._rows.pop(entry, None)
        self._answering.pop(entry, None)
        self._answers.pop(entry, None)
        self._stood_in.discard(entry)

    def tell(self, task: SparseTask, error: BaseException) -> None:
        """A round failed on this rank: tell its root (a peer) or the other local ranks (the root)."""
        key, text = _key_of(task), str(error).encode()
        if task.role is Role.PEER:
            self.channel.send(local_root(task.table.table_id, self.local_size), Command.ERROR, key, task.round,
                              payload=text)
            return
        for rank in range(self.local_size):
            if rank != self.local_rank:
                self.channel.send(rank, Command.ERROR, key, task.round, payload=text)


def _cut(ids: np.ndarray, rows: np.ndarray, limit: int, what: str) -> List[Optional[np.ndarray]]:
    """Records in messages for the local channel; TaskFailed for a single record larger than a message."""
    try:
        return encode_chunks(ids, rows, limit, what)
    except ValueError as exc:
        raise TaskFailed(exc) from None


def _layout(task: SparseTask) -> Dict[str, Any]:
    """The table as a local rank declares it to its root (and a joined root stands in with)."""
    table = task.table
    return {"name": table.name, "table_id": table.table_id, "rows": table.num_rows,
            "row_shape": list(table.row_shape), "dtype": table.dtype.name.lower(),
            "held": table.held.wire() if table.held is not None else None}


def _key_of(task: SparseTask) -> int:
    """The table's key on the local channel: its key of server 0."""
    return sparse_key(task.table.table_id, 0)


class SparseStandIn:
    """An event: start a joined root's stand-in task for a row-sparse round (its trips, one per server)."""

    __slots__ = ("task", "trips")

    def __init__(self, task: SparseTask, trips: List[SparseTrip]) -> None:
        self.task, self.trips = task, trips

    def deliver(self, dispatcher: Any) -> None:
        dispatcher.tasks.add(self.task, self.trips)
        for trip in self.trips:
            dispatcher.advance(trip)

