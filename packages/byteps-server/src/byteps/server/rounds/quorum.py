"""Backup workers (BYTEPS_BACKUP_WORKERS=b): rounds that close at a quorum of machines.

A key declared with a quorum (``PartitionSpec.quorum``: the job's machines
less b) closes each round at that many machines' pushes; the engine is
declared with the quorum as its contributors. A push for a round already
closed is acknowledged, dropped and counted (the report's ``late_pushes``),
and its pull is answered with that round's sum, the one every other
machine got: the server keeps each closed round's answer (its *history*,
compressed if the key is) until every machine has pushed past it, so the
late machine applies the same updates.

A round's pulls wait while some machine is more than
:data:`BACKUP_MAX_LAG` rounds behind it, which bounds the history. The
answer's aux (:func:`~byteps.common.tensor_description.quorum_aux`) says
how many machines the sum holds and how many rounds had closed after it; a
machine that knows it is behind may then skip a closed round: its PULL,
flagged FLAG_SKIPPED and with no push, is answered with that round's sum
and counts as having moved past it.

With join (:mod:`~byteps.server.rounds.joined`): a joined machine, which
pushes no more, is left out of the lag bound (else everybody's pulls would
wait for it after BACKUP_MAX_LAG rounds); a round still closes at
``quorum`` pushes of machines that have not joined, but when fewer of those
are left than the quorum, it closes once each of them pushed, padded with
zeros up to the quorum, so the answer still holds ``quorum`` machines.
"""

from __future__ import annotations

import logging
from typing import Dict

from byteps.common.tensor_description import describe_op, quorum_aux
from byteps.server.rounds.key_state import KeyState, RoundServices
from byteps.server.rounds.sync_sum import SyncSum, _cannot_skip
from byteps.transport import Command, Message
from byteps.transport.frames import FLAG_AVERAGE, FLAG_PULL, FLAG_SKIPPED

__all__ = ["BACKUP_MAX_LAG", "QuorumSum"]

log = logging.getLogger("byteps.server")

#: A round's sum is held back while a machine is more rounds behind it than this.
BACKUP_MAX_LAG = 4


class QuorumSum(SyncSum):
    """A synchronous sum whose rounds close at ``spec.quorum`` machines' pushes (backup workers)."""

    def __init__(self, state: KeyState, services: RoundServices) -> None:
        super().__init__(state, services)
        self.quorum = state.spec.quorum
        self.machines = state.spec.contributors or services.num_machines
        self.history: Dict[int, bytes] = {}  # closed round -> its answer, until every machine pushed past it
        self.last_round: Dict[int, int] = {}  # machine -> last round it pushed (or skipped)

    def push(self, message: Message) -> None:
        header = message.header
        if not header.flags & FLAG_AVERAGE or header.aux:
            # Only averages over every worker may close without the late machines; a worker names the rounds
            # that must wait for every machine apart (byteps.common.engine.task_maker), so this is a worker
            # of another kind, and its round would silently miss machines.
            raise ValueError(f"{self.spec.describe()}: a push that {describe_op(False, header.aux)} from worker "
                             f"{header.sender}, but the key's rounds close at {self.quorum} machines' pushes "
                             "(backup workers): only averages over every worker may")
        self.last_round[header.sender // self.local_size] = header.round
        if header.round <= self.engine.completed_round(self.key):
            self._drop_late_push(message)
            return
        super().push(message)
        if self.pending_pulls and header.round > self.engine.completed_round(self.key):
            self.answer_pulls()  # the round is open, but a lagging machine moved: held sums may go

    def _drop_late_push(self, message: Message) -> None:
        """A push for a round that closed without it is acknowledged and dropped."""
        header = message.header
        self.services.late_pushes += 1
        log.debug("dropped the late push of round %d for %s from worker %d (round %d closed)", header.round,
                  self.spec.describe(), header.sender, self.engine.completed_round(self.key))
        if not header.flags & FLAG_PULL:
            self.send(Command.PUSH_ACK, self.rank, self.key, header.round, identity=message.identity)
        if self.pending_pulls:  # a lagging machine moved: held sums may go
            self.answer_pulls()

    def _keep(self, round_: int) -> None:
        """Late machines pull this round later: keep its answer until every machine pushed past it."""
        answer = self.engine.result(self.key, round_) if self.codec is None else \
            self.codec.keep(round_, self.engine.result(self.key, round_))
        self.history[round_] = bytes(answer)
        self._release(round_)  # pulls are answered from the copy
        self._forget_history(self.slowest_round())

    def _add_joined_zeros(self) -> None:
        if self.takes_joined_zeros:
            self._push_zeros(self.joined.zeros_for_quorum(self.pushed, self.quorum))

    def machine_joined(self) -> None:
        super().machine_joined()
        if self.pending_pulls:  # the joined machine no longer holds back the lag bound
            self.answer_pulls()

    def pull(self, message: Message) -> None:
        header = message.header
        closed = header.round in self.history
        if header.flags & FLAG_SKIPPED:  # a closed round this machine did not compute
            if not closed:
                raise ValueError(_cannot_skip(header.round, self.spec.describe()))
            machine = header.sender // self.local_size
            self.last_round[machine] = max(self.last_round.get(machine, -1), header.round)
        # A late machine's pull of a closed round names that round.
        self._queue_pull(message, header.round if closed else self.engine.completed_round(self.key))

    def answer_pulls(self) -> None:
        completed = self.engine.completed_round(self.key)
        slowest = self.slowest_round()
        self._answer_through(min(completed, slowest + BACKUP_MAX_LAG), completed)
        self._forget_history(slowest)

    def _forget_history(self, slowest: int) -> None:
        """Drop the closed rounds every machine pushed past: they are never pulled again."""
        for old in [r for r in self.history if r < slowest]:
            del self.history[old]

    def slowest_round(self) -> int:
        """The last round the slowest machine that has not joined pushed (or skipped); -1 while one of them
        has pushed nothing yet (not even its INIT_KEY may have come)."""
        joined = self.joined_machines
        return min((self.last_round.get(machine, -1) for machine in range(self.machines) if machine not in joined),
                   default=-1)

    def _answer(self, identity: bytes, round_: int, bare: bool, completed: int) -> None:
        self._send_answer(identity, round_, None if bare else self.history[round_],
                          quorum_aux(self.quorum, completed - round_))
