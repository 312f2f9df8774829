"""Row-sparse keys (docs/sparse.md): the rows of a table this server holds, summed by id, round by round.

A key declared with ``PartitionSpec.sparse`` is one server's share of a
row-sparse table: the rows whose ids hash to this server
(:func:`byteps.common.row_sparse.server_of`). Each worker machine's PUSH
of a round carries its (id, row) records for those rows, its ids unique
and ascending (:func:`~byteps.common.row_sparse.encode`; possibly none),
and is also its PULL (FLAG_PULL); with several worker processes per
machine the table's local root pushes the machine's rows, summed by id
there first (byteps.common.engine.sparse_local). When every machine has
pushed the round, :class:`SparseRowSum` sums the rows by id (float16 and
bfloat16 in float32, rounded once; machines in order, so the sums are the
same whatever order the pushes came in) and answers every machine with
the same records: the union of the round's ids,
ascending, and their sums. Nothing is kept once the round is answered: the
table itself lives on the workers. The engine's dense accumulators are not used, since the size of
a round is only known when its last push is in.

The rules a round enforces (each broken one is a ValueError, answered
with an ERROR; one that spoils the round fails it on every machine that
pushed it, and its later pushes get the same ERROR):

- one push per machine and round, carrying its pull. A push may come in
  several messages (each at most the payload limit, BYTEPS_PARTITION_BYTES,
  whole records in order): each says how many in its header's ``aux``
  (0 counts as 1), and the last carries the pull. A push of a later
  round than the open one means its machine failed the open round (which
  is closed, its pushers told), one of an earlier round is refused;
- every push of a round averages or sums alike (FLAG_AVERAGE);
- a push is whole records, its ids ascending, unique and within the
  table's rows;
- the round's answer goes to each machine in as many PULL_RESPONSEs as
  the payload limit needs, each with their number in ``aux``; only a
  single record larger than the limit fails the round.

A machine that joined (``hvd.join()``, :mod:`byteps.server.rounds.joined`)
counts as an empty push in every round until every machine joined, as a
dense round counts it as zeros: a round closes when the machines that
have not joined pushed it, and averages still divide by every worker (the
workers divide). (With several worker processes per machine a rank may not
join while row-sparse tables are in use: the worker refuses it,
docs/sparse.md.)
"""

from __future__ import annotations

import time
from typing import Dict, List, NoReturn, Optional, Set, Tuple

import numpy as np

from byteps.common.dtypes import DType
from byteps.common.row_sparse import decode, encode_chunks, sum_by_id
from byteps.server.rounds.key_state import KeyState, RoundServices
from byteps.server.stall_inspector import PartialRound
from byteps.transport import Command, Message
from byteps.transport.frames import FLAG_AVERAGE, FLAG_PULL

__all__ = ["SparseRowSum"]


class SparseRowSum:
    """One server's rows of a row-sparse table: each round's pushes summed by id, the union answered to all.

    Example (two machines, rows of 2 floats)::

        state = declare_key(key, spec, services)              # spec.sparse: builds this policy
        state.policy.push(push_ids_1_4_from_machine_0)        # FLAG_PULL: kept until the round closes
        state.policy.pull(its_pull)
        state.policy.push(push_ids_4_from_machine_1)          # closes the round: both get ids [1, 4]
        state.policy.pull(its_pull)
    """

    def __init__(self, state: KeyState, services: RoundServices) -> None:
        spec = state.spec
        if spec.partition != services.rank:
            raise ValueError(f"{spec.describe()} declared to server {services.rank}: a worker places a table's "
                             "rows by another number of servers (every worker must see the same servers)")
        self.state = state
        self.key = state.key
        self.spec = spec
        self.services = services
        self.send = services.send
        self.rank = services.rank
        self.dtype = DType(spec.dtype)
        self.num_rows = spec.shape[0]
        self.row_shape = tuple(spec.shape[1:])
        self.machines = services.num_machines
        self.local_size = services.local_size  # a pusher's machine is its rank // local_size
        self.joined = services.joined.machines  # the shared dict itself (cleared in place once all joined)
        self.completed = -1  # the last closed (answered or failed) round
        self.pushed: Dict[int, Tuple[bytes, np.ndarray, np.ndarray]] = {}  # machine -> (identity, ids, rows)
        # machine -> (identity, parts in all, the (ids, rows) of those in so far): pushes still coming in parts
        self.parts: Dict[int, Tuple[bytes, int, List[Tuple[np.ndarray, np.ndarray]]]] = {}
        self.round_started = 0.0
        self.round_flags = 0  # FLAG_AVERAGE of the open round's first push
        self.round_first = 0  # the rank of that push
        self.pending: List[Tuple[bytes, int]] = []  # (identity, round): pulls the open round answers
        self.answer: Optional[Tuple[int, List[Optional[np.ndarray]], Set[bytes]]] = None  # closed round, its
        # payloads, the machines not yet answered
        self.failed: Dict[int, str] = {}  # round -> why it failed: its late pushes get this ERROR

    # --- pushes ----------------------------------------------------------------------------
    def push(self, message: Message) -> None:
        header = message.header
        round_ = header.round
        if round_ in self.failed:
            raise ValueError(self.failed[round_])
        if round_ > self.completed + 1:
            self._skip_to(round_, header.sender)
        elif round_ <= self.completed:
            raise ValueError(f"push of round {round_} for {self.spec.describe()}: the open round is "
                             f"{self.completed + 1}")
        machine = header.sender // self.local_size
        if machine in self.pushed:
            raise ValueError(f"second push of round {round_} for {self.spec.describe()}")
        _, of, parts = self.parts.get(machine, (message.identity, max(header.aux, 1), []))
        last = len(parts) + 1 == of
        if max(header.aux, 1) != of or bool(header.flags & FLAG_PULL) != last:
            self.parts.pop(machine, None)  # its sender hears of the failure from the raise
            self._fail_open_round(
                f"worker {header.sender}: push of round {round_} for {self.spec.describe()}, part {len(parts) + 1} "
                f"of {max(header.aux, 1)} (aux), {'with' if header.flags & FLAG_PULL else 'without'} its pull: a "
                f"row-sparse push is {of} part(s), the last one carrying the pull (FLAG_PULL)")
        flags = header.flags & FLAG_AVERAGE
        if (self.pushed or self.parts) and flags != self.round_flags:
            how = {FLAG_AVERAGE: "averages", 0: "sums"}
            self._fail_open_round(f"mismatch for {self.spec.describe()}: worker {header.sender} {how[flags]} but "
                                  f"worker {self.round_first} {how[self.round_flags]}; every worker must use the "
                                  "same op for a table")
        try:
            ids, rows = self._records(message)
        except ValueError as exc:
            self._fail_open_round(f"worker {header.sender}: {exc}")
        if not self.pushed and not self.parts:
            self.round_started, self.round_flags, self.round_first = time.monotonic(), flags, header.sender
        parts.append((ids, rows))
        if not last:
            self.parts[machine] = (message.identity, of, parts)
            return
        self.parts.pop(machine, None)
        try:
            ids, rows = self._whole(header.sender, parts)
        except ValueError as exc:
            self._fail_open_round(str(exc))
        self.pushed[machine] = (message.identity, ids, rows)
        if self._complete():
            self._close()

    def _complete(self) -> bool:
        """Every machine pushed the open round, or joined (an empty push)."""
        empty = sum(1 for machine in self.joined if machine not in self.pushed)
        return len(self.pushed) + empty >= self.machines

    def _records(self, message: Message) -> Tuple[np.ndarray, np.ndarray]:
        """The push's ids and rows (views of its payload), checked."""
        ids, rows = decode(message.payload, self.row_shape, self.dtype)
        self._check_ids(ids, "pushed for")
        return ids, rows

    def _whole(self, sender: int, parts: List[Tuple[np.ndarray, np.ndarray]]) -> Tuple[np.ndarray, np.ndarray]:
        """A push's parts (each checked) put together; ValueError unless its ids stay ascending across them."""
        if len(parts) == 1:
            return parts[0]
        ids, rows = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        if not np.all(ids[1:] > ids[:-1]):
            raise ValueError(f"worker {sender}: row ids pushed for {self.spec.describe()} are not unique and "
                             "ascending across the push's parts")
        return ids, rows

    def _check_ids(self, ids: np.ndarray, how: str) -> None:
        """ValueError unless ``ids`` (``how`` this table: "pushed for", "looked up in") are ascending, unique
        and within the table."""
        if len(ids):
            if ids[0] < 0 or ids[-1] >= self.num_rows:
                raise ValueError(f"row ids outside [0, {self.num_rows}) {how} {self.spec.describe()}")
            if len(ids) > 1 and not np.all(ids[1:] > ids[:-1]):
                raise ValueError(f"row ids {how} {self.spec.describe()} are not unique and ascending")

    def _fail_open_round(self, text: str) -> NoReturn:
        """The open round cannot be summed: every machine that pushed it gets ``text``, and so will those that
        push it later (raised here, for the message being handled)."""
        round_ = self.completed + 1
        for identity in self._pushers():
            self.send(Command.ERROR, self.rank, self.key, round_, payload=text.encode(), identity=identity)
        self.failed[round_] = text
        self._forget_open_round()
        raise ValueError(text)

    def _pushers(self) -> Set[bytes]:
        """The connections that pushed the open round, whole or in part."""
        return {identity for identity, _, _ in self.pushed.values()} | {
            identity for identity, _, _ in self.parts.values()}

    def _skip_to(self, round_: int, sender: int) -> None:
        """A machine pushed a round past the open one: it failed the rounds in between (a worker's refusal
        this server heard of before the key existed, and whose pushes it refused). They are closed without a
        sum; whoever pushed the open one gets an ERROR."""
        text = (f"round {self.completed + 1} of {self.spec.describe()} failed (worker {sender} went on to round "
                f"{round_}); see the first error of this push_pull")
        for identity in self._pushers():
            self.send(Command.ERROR, self.rank, self.key, self.completed + 1, payload=text.encode(), identity=identity)
        while self.completed + 1 < round_:
            self.failed[self.completed + 1] = text
            self._forget_open_round()

    def _forget_open_round(self) -> None:
        self.completed += 1
        self.failed.pop(self.completed - 2, None)  # pushes of a round come before the machines' next round
        self.pushed.clear()
        self.parts.clear()
        self.pending = [(identity, round_) for identity, round_ in self.pending if round_ > self.completed]

    def _close(self) -> None:
        """Every machine pushed: sum the rows by id, answer the pulls that wait."""
        round_ = self.completed + 1
        pushes = [self.pushed[machine] for machine in sorted(self.pushed)]
        ids = np.concatenate([p[1] for p in pushes])
        rows = np.concatenate([p[2] for p in pushes])
        union, sums = sum_by_id(ids, rows, self.dtype)
        self.answer = (round_, self._answer_of(round_, union, sums), {p[0] for p in pushes})
        pending = [(identity, pulled) for identity, pulled in self.pending if pulled == round_]
        self._forget_open_round()
        for identity, pulled in pending:
            self._answer(identity, pulled)

    def _answer_of(self, round_: int, union: np.ndarray, sums: np.ndarray) -> List[Optional[np.ndarray]]:
        """The payloads that answer a closed round: its union of ids and their sums (a held table's policy
        applies them instead)."""
        try:
            return encode_chunks(union, sums, self.services.max_payload_bytes,
                                 f"round {round_} of {self.spec.describe()}")
        except ValueError as exc:
            self._fail_open_round(str(exc))

    # --- pulls -----------------------------------------------------------------------------
    def pull(self, message: Message) -> None:
        header = message.header
        identity, round_ = message.identity, header.round
        if self.answer is not None and round_ == self.answer[0] and identity in self.answer[2]:
            self._answer(identity, round_)
            return
        pushed = self.pushed.get(header.sender // self.local_size)
        if round_ != self.completed + 1 or pushed is None or pushed[0] != identity:
            raise ValueError(f"pull of round {round_} for {self.spec.describe()} without its push")
        if (identity, round_) in self.pending:
            raise ValueError(f"second pending pull for {self.spec.describe()}")
        self.pending.append((identity, round_))

    def _answer(self, identity: bytes, round_: int) -> None:
        closed, payloads, waiting = self.answer
        for payload in payloads:
            self.send(Command.PULL_RESPONSE, self.rank, self.key, round_, payload=payload, dtype=self.spec.dtype,
                      aux=len(payloads), identity=identity)
        waiting.discard(identity)
        if not waiting:
            self.answer = None  # every machine has the round: nothing of it is kept

    def is_waiting(self, identity: bytes, round_: int) -> bool:
        return (identity, round_) in self.pending

    # --- join, failures and stalls --------------------------------------------------------------
    def machine_joined(self) -> None:
        """A machine joined: the open round, if some machine pushed it, may now be complete (a round nobody
        pushed closes at its first push)."""
        if self.pushed and self._complete():
            try:
                self._close()
            except ValueError:
                pass  # the round failed (its union too large): its pushers have the ERROR; the JOIN stands

    def fail_round(self, round_: int) -> None:
        """A worker failed ``round_`` (the server sent its ERROR to every other worker that declared the key):
        the open round is closed without a sum. (A later round's pushes are refused by the server, and the
        first push past it skips it here.)"""
        if round_ == self.completed + 1:
            self._forget_open_round()

    def partial_round(self) -> Optional[PartialRound]:
        if not self.pushed and not self.parts:
            return None
        pushed = set(self.pushed) | set(self.parts)  # machines, as the inspector counts them
        return PartialRound(self.key, self.spec.name, self.completed + 1, self.round_started, pushed)

