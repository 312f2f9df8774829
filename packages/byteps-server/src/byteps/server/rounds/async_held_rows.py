"""A server-held table in an asynchronous job (BYTEPS_ENABLE_ASYNC, docs/sparse.md): each push applied on arrival.

What :class:`~byteps.server.rounds.held_rows.HeldRows` does for a
synchronous table, without rounds that wait for every machine: every
worker *process* pushes its own rows (no machine sum, which would pace a
machine's processes together), and the server steps the pushed rows with
the table's optimizer as soon as a push is whole, then answers that
process alone. As for asynchronous dense keys (docs/async.md), nothing is
averaged: each worker's gradients are its own step.

The rules:

- every push is applied **exactly once** and one process's pushes **in
  order**: a push carries the process's round of the table, which must
  be past the last one applied for it (a duplicate or an older round is
  refused; a gap is a call refused on that process, which told no one);
- a push may come in parts (each at most the payload limit, whole
  records, ids ascending across them), each saying how many in ``aux``,
  the last one carrying the pull (FLAG_PULL);
- the answer (empty: the rows are applied) goes at once, or, with
  BYTEPS_ASYNC_MAX_STALENESS=s, once the slowest process that declared
  the table (of the machines that have not joined) is at most ``s``
  rounds behind: since a worker looks its next rows up only after its
  update's answer, no worker runs more than ``s`` rounds ahead;
- lookups, saves and loads are answered as for a synchronous table.

The server counts the pushes it applied (bpslaunch's summary line, "servers
applied N asynchronous pushes").
"""

from __future__ import annotations

import time
from typing import Dict, List, Optional, Tuple

import numpy as np

from byteps.server.rounds.held_rows import HeldRows
from byteps.server.rounds.key_state import KeyState, RoundServices
from byteps.server.stall_inspector import PartialRound
from byteps.transport import Command, Message
from byteps.transport.frames import FLAG_LOOKUP, FLAG_PULL

__all__ = ["AsyncHeldRows"]


class AsyncHeldRows(HeldRows):
    """One server's shard of an asynchronous server-held table: each process's push stepped when it is whole.

    Example (rows of 2 floats, SGD)::

        state = declare_key(key, spec, services)     # spec.held and spec.asynchronous: builds this policy
        state.policy.push(push_of_worker_1_round_0)  # applied now; FLAG_PULL: answered now (no staleness bound)
    """

    def __init__(self, state: KeyState, services: RoundServices) -> None:
        super().__init__(state, services)
        self.applied: Dict[bytes, int] = {}  # identity -> the last round of its applied
        # identity -> (round, parts in all, the (ids, rows) of those in so far): pushes still coming in parts
        self.incoming: Dict[bytes, Tuple[int, int, List[Tuple[np.ndarray, np.ndarray]]]] = {}
        self.waiting: List[Tuple[bytes, int]] = []  # (identity, round): answers held by the staleness bound
        self.started = 0.0  # when the oldest push still in parts began

    def push(self, message: Message) -> None:
        header = message.header
        identity, round_ = message.identity, header.round
        last_applied = self.applied.get(identity, -1)
        if round_ <= last_applied:
            raise ValueError(f"worker {header.sender}: push of round {round_} for {self.spec.describe()} after its "
                             f"round {last_applied} was applied: each push is applied once, in order")
        pending_round, of, parts = self.incoming.get(identity, (round_, max(header.aux, 1), []))
        last = len(parts) + 1 == of
        if pending_round != round_ or max(header.aux, 1) != of or bool(header.flags & FLAG_PULL) != last:
            self.incoming.pop(identity, None)
            raise ValueError(f"worker {header.sender}: push of round {round_} for {self.spec.describe()}, part "
                             f"{len(parts) + 1} of {max(header.aux, 1)} (aux), after part(s) of round {pending_round}: "
                             f"a push is {of} part(s) of one round, the last one carrying the pull (FLAG_PULL)")
        try:
            parts.append(self._records(message))
        except ValueError as exc:
            self.incoming.pop(identity, None)
            raise ValueError(f"worker {header.sender}: {exc}") from None
        if not last:
            if not self.incoming:
                self.started = time.monotonic()
            self.incoming[identity] = (round_, of, parts)
            return
        self.incoming.pop(identity, None)
        ids, rows = self._whole(header.sender, parts)
        self.store.apply(ids, rows.reshape(len(ids), self.store.row_size))
        self.applied[identity] = round_
        self.services.async_pushes += 1
        if self.waiting:
            self._answer_waiting()

    def pull(self, message: Message) -> None:
        header = message.header
        if header.flags & FLAG_LOOKUP:
            super().pull(message)
            return
        if self.applied.get(message.identity) != header.round:
            raise ValueError(f"pull of round {header.round} for {self.spec.describe()} without its push")
        self.waiting.append((message.identity, header.round))
        self._answer_waiting()

    def _answer_waiting(self) -> None:
        """Answer the pulls within BYTEPS_ASYNC_MAX_STALENESS rounds of the slowest process, the others later."""
        bound = self.services.async_max_staleness
        slowest = None
        if bound is not None:
            joined = self.joined
            rounds = [self.applied.get(identity, -1) for identity, rank in self.state.declared_by.items()
                      if rank // self.local_size not in joined]
            processes = (self.machines - len(joined)) * self.local_size  # those yet to declare have applied none
            slowest = min(rounds) if len(rounds) >= processes and rounds else -1
        held = []
        for identity, round_ in self.waiting:
            if slowest is not None and round_ - slowest > bound:
                held.append((identity, round_))
                continue
            self.send(Command.PULL_RESPONSE, self.rank, self.key, round_, payload=None, dtype=self.spec.dtype,
                      aux=1, identity=identity)
        self.waiting = held

    def is_waiting(self, identity: bytes, round_: int) -> bool:
        return (identity, round_) in self.waiting

    def machine_joined(self) -> None:
        """A joined machine's processes no longer hold the others back."""
        if self.waiting:
            self._answer_waiting()

    def fail_round(self, round_: int) -> None:
        """Nobody waits for another process's round: a failure elsewhere changes nothing here."""

    def partial_round(self) -> Optional[PartialRound]:
        if not self.incoming:
            return None
        pushed = {self.state.declared_by.get(identity, -1) for identity in self.incoming}
        oldest = min(round_ for round_, _, _ in self.incoming.values())
        return PartialRound(self.key, self.spec.name, oldest, self.started, pushed)
