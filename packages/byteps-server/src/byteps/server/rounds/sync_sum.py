"""The synchronous round (BytePS's synchronous mode): sum one push per machine, then answer every pull.

Per key and round, :class:`SyncSum` hands each machine's PUSH to the C++
``ServerEngine``, which sums it straight out of the transport's receive
buffer; when the last machine's push is in, the round is closed and every
PULL of it is answered zero-copy from the engine's result. The result is
released as soon as every machine that pushed the round has its answer
(its buffer returns to the engine's pool when the last send of it is done),
so a server holds sums for the rounds in flight, not two per key.

The rules a round enforces (each broken one is a ValueError, which the
server answers with an ERROR):

- one push per machine and round (with several worker processes per
  machine, the partition's local root pushes for the machine);
- every push of a round averages or sums alike (FLAG_AVERAGE) and carries
  the same aux (1 + a broadcast's root, a gather's tag, a layout notice's
  tag, else 0): a push that differs fails the round on every machine that
  pushed it;
- a push of a later round than the open one means its machine failed the
  open round (a refused push, a mismatch among its local ranks): the open
  round is closed with zeros for the machines missing, its pulls answered
  with the ERROR, and a late push of it is refused, so the key's next
  rounds pair up on every machine again;
- a pull names the last closed round or the next, and a connection has at
  most one pull pending per key;
- FLAG_ZEROS: a gather's partition this worker has no bytes in, zeros not
  sent; FLAG_BARE: the worker holds the sum already and the answer is a
  header alone.

What else a round can be is a subclass or a strategy of this one:
:class:`~byteps.server.rounds.compressed.CompressedSums` (a codec the sum
goes through), :class:`~byteps.server.rounds.quorum.QuorumSum` (backup
workers) and :class:`~byteps.server.rounds.async_store.AsyncStore`
(asynchronous keys). Joined machines' zeros (:mod:`~byteps.server.rounds.joined`)
are pushed here: when a machine that has not joined pushes a round, and
when a JOIN arrives for the rounds already started. A push from a joined
machine comes after every machine joined (join returns only then), so
such a round is a new one and takes no zeros.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from byteps.common.tensor_description import TAG_NOTICE, describe_op
from byteps.server.rounds.compressed import CompressedSums
from byteps.server.rounds.key_state import KeyState, RoundServices, wire_log
from byteps.server.stall_inspector import PartialRound
from byteps.transport import Command, Message
from byteps.transport.frames import FLAG_AVERAGE, FLAG_BARE, FLAG_PULL, FLAG_SKIPPED, FLAG_ZEROS

__all__ = ["SyncSum"]

#: The header flags every push of a round must agree on (the others describe one message, not the round).
_ROUND_FLAGS = ~(FLAG_ZEROS | FLAG_PULL | FLAG_BARE)


class SyncSum:
    """A key whose rounds wait for every machine's push, summed by the engine, and answer every pull.

    Example (what the server does for a key of two machines)::

        state = declare_key(key, spec, services)     # builds this policy
        state.policy.push(push_from_machine_0)       # PUSH_ACK
        state.policy.pull(pull_from_machine_0)       # kept: round 0 is open
        state.policy.push(push_from_machine_1)       # closes round 0: PUSH_ACK, then the pull is answered
    """

    def __init__(self, state: KeyState, services: RoundServices) -> None:
        self.state = state
        self.key = state.key
        self.spec = state.spec
        self.services = services
        self.engine = services.engine
        self.send = services.send
        self.rank = services.rank
        self.local_size = services.local_size
        self.tracer = services.tracer
        self.joined = services.joined
        self.joined_machines = services.joined.machines  # the shared dict itself (cleared in place)
        self.codec: Optional[CompressedSums] = CompressedSums(state.spec) if state.spec.compression else None
        # A process set's key is summed over its machines only: join covers collectives over every rank.
        self.takes_joined_zeros = (state.spec.contributors or services.num_machines) == services.num_machines
        self.pending_pulls: List[Tuple[bytes, int]] = []  # (identity, round), in arrival order
        self.bare_pulls: Set[Tuple[bytes, int]] = set()  # pending pulls flagged FLAG_BARE
        self.pushed: Dict[int, Optional[bytes]] = {}  # machine -> identity in the open round (None: its zeros)
        # round -> who pushed it and has not had its pull answered: when none is left, the engine lets the sum go
        self.unanswered: Dict[int, Set[bytes]] = {}
        self.round_started = 0.0  # time.monotonic() of the open round's first push
        self.round_flags = 0  # flags of that first push (FLAG_AVERAGE): every push of a round must agree
        self.round_tag = 0  # and its aux (1 + a broadcast's root, else 0), which must agree too
        self.round_first = 0  # the rank that pushed it, for a mismatch's message
        self.round_after_join = False  # a joined machine pushed the open round: it started after every join
        self.join_failed: Dict[int, str] = {}  # round a joined machine could not take part in -> the ERROR
        self.abandoned: Dict[int, str] = {}  # round a machine failed and went past -> the ERROR its pulls get

    # --- pushes ----------------------------------------------------------------------------
    def push(self, message: Message) -> None:
        header = message.header
        machine = header.sender // self.local_size
        pushed = self.pushed
        if self.abandoned and header.round in self.abandoned:
            raise ValueError(self.abandoned[header.round])
        if pushed and not self.spec.quorum and header.round > self.engine.completed_round(self.key) + 1:
            self._abandon_open_round(header)
        if machine in pushed:
            raise ValueError(f"second push of round {header.round} for {self.spec.describe()}")
        flags = header.flags & _ROUND_FLAGS
        if pushed and (flags != self.round_flags or header.aux != self.round_tag):
            self._refuse_round(message, flags)
        payload = message.payload if message.payload is not None else b""
        zeros = bool(header.flags & FLAG_ZEROS)
        if zeros:  # a gather's partition this worker has no bytes in: zeros, not sent
            if payload or self.codec is not None:
                raise ValueError(f"a push flagged zeros must carry no payload and an uncompressed key "
                                 f"({self.spec.describe()})")
            payload = self.services.zeros(self.spec.nbytes)
        tracer = self.tracer
        received = time.time() if tracer is not None and tracer.traces(header.round) else 0.0
        if self.codec is not None:  # summed dense; the engine holds the decompressed array until the round ends
            payload = self.codec.decompress(payload, not pushed)
        complete = self.engine.push(self.key, header.round, payload, zeros=zeros)
        waiting = self.unanswered.get(header.round)
        if waiting is None:
            self.unanswered[header.round] = {message.identity}
        else:
            waiting.add(message.identity)
        if received:
            tracer.span("receive", self.spec.name, received, time.time(), key=self.key,
                        partition=self.spec.partition, worker=header.sender, step=header.round + 1)
        # The ack frees the worker's scheduling credit; it depends on nothing
        # but this push, so no worker's credit waits on another worker.
        if not header.flags & FLAG_PULL:  # a push that carries its pull: the server decides after the pull
            self.send(Command.PUSH_ACK, self.rank, self.key, header.round, identity=message.identity)
        if not pushed:
            self.round_started, self.round_flags, self.round_tag = time.monotonic(), flags, header.aux
            self.round_first = header.sender
        pushed[machine] = message.identity
        if complete:
            self._close()
        elif self.joined_machines:
            self._count_joined(machine)

    def _refuse_round(self, message: Message, flags: int) -> None:
        """A push that averages where the round's others sum, or names another broadcast root: fail them all."""
        header = message.header
        mine = describe_op(bool(flags & FLAG_AVERAGE), header.aux)
        theirs = describe_op(bool(self.round_flags & FLAG_AVERAGE), self.round_tag)
        text = (f"mismatch for {self.spec.describe()}: worker {header.sender} {mine} "
                f"but worker {self.round_first} {theirs}; every worker must use the same op (and root) for a tensor")
        for identity in self.pushed.values():
            if identity is not None:
                self.send(Command.ERROR, self.rank, self.key, header.round, payload=text.encode(), identity=identity)
        raise ValueError(text)

    def _abandon_open_round(self, header: Any) -> None:
        """A machine pushed a round past the open one, which it failed: close the open round with zeros for
        the machines missing (the engine then holds no partial sum) and answer its pulls with an ERROR."""
        round_ = self.engine.completed_round(self.key) + 1
        self.abandoned[round_] = (f"round {round_} of {self.spec.describe()} failed (worker {header.sender} went on "
                                  f"to round {header.round}); see the first error of this push_pull")
        zeros = self.services.zeros(self.spec.nbytes)
        missing = 0
        while not self.engine.push(self.key, round_, zeros, zeros=True):
            missing += 1
            if missing > self.services.num_machines:
                raise RuntimeError(f"{self.spec.describe()}: round {round_} does not close")
        self._close()

    def _close(self) -> None:
        """The open round is complete: keep what its pulls need, start the next, answer what waits."""
        round_ = self.engine.completed_round(self.key)
        if self.tracer is not None and self.tracer.traces(round_):
            finished = time.time()  # the round began at its first push (round_started, monotonic)
            self.tracer.span("sum", self.spec.name, finished - (time.monotonic() - self.round_started), finished,
                             key=self.key, partition=self.spec.partition, step=round_ + 1)
        self._keep(round_)
        self.pushed.clear()
        self.round_after_join = False
        if self.pending_pulls:
            self.answer_pulls()

    def _keep(self, round_: int) -> None:
        """What a closed round leaves for its pulls: the engine's sum itself, or its compressed copy (the
        engine's sum is then released at once)."""
        if self.codec is not None:
            self.codec.keep(round_, self.engine.result(self.key, round_))
            self._release(round_)

    def _release(self, round_: int) -> None:
        self.unanswered.pop(round_, None)
        self.engine.release(self.key, round_)

    # --- join ------------------------------------------------------------------------------
    def machine_joined(self) -> None:
        if self.pushed and not self.round_after_join:
            self._add_joined_zeros()

    def _count_joined(self, machine: int) -> None:
        """After a push that left the round open while some machines have joined."""
        if machine in self.joined_machines:
            self.round_after_join = True
        elif not self.round_after_join:
            self._add_joined_zeros()

    def _add_joined_zeros(self) -> None:
        """Push zeros for each joined machine missing from the open round."""
        if self.takes_joined_zeros:
            self._push_zeros(self.joined.zeros_for(self.pushed))

    def _push_zeros(self, machines: List[int]) -> None:
        """Push zeros into the open round for each of ``machines`` (joined); close it if they complete it."""
        for machine in machines:
            round_ = self.engine.completed_round(self.key) + 1
            if self.round_tag and not self.round_tag & TAG_NOTICE:  # a joined machine's zeros agree with a notice
                self.join_failed[round_] = self.joined.refusal(self.spec, self.round_tag, machine)
            complete = self.engine.push(self.key, round_, self.services.zeros(self.spec.nbytes), zeros=True)
            self.pushed[machine] = None
            if complete:
                self._close()
                return

    # --- pulls -----------------------------------------------------------------------------
    def pull(self, message: Message) -> None:
        if message.header.flags & FLAG_SKIPPED:
            raise ValueError(_cannot_skip(message.header.round, self.spec.describe()))
        self._queue_pull(message, self.engine.completed_round(self.key))

    def _queue_pull(self, message: Message, completed: int) -> None:
        """Keep a pull until its round closed (``completed``: the last closed round it may name), then answer."""
        header = message.header
        round_ = header.round
        if self.join_failed and round_ in self.join_failed:
            raise ValueError(self.join_failed[round_])
        # A worker pulls round r after pushing it, and pushes r + 1 only after
        # its pull of r was answered: r is the last completed round or the next.
        if round_ != completed and round_ != completed + 1:
            raise ValueError(f"pull of round {round_} for {self.spec.describe()}: "
                             f"the last completed round is {completed}")
        identity = message.identity
        for waiting, _ in self.pending_pulls:
            if waiting == identity:
                raise ValueError(f"second pending pull for {self.spec.describe()}")
        self.pending_pulls.append((identity, round_))
        if header.flags & FLAG_BARE:  # the worker holds the sum already: the answer is a header
            self.bare_pulls.add((identity, round_))
        if completed >= round_:
            self.answer_pulls()

    def is_waiting(self, identity: bytes, round_: int) -> bool:
        return (identity, round_) in self.pending_pulls

    def answer_pulls(self) -> None:
        """Answer every pending pull whose round has closed."""
        completed = self.engine.completed_round(self.key)
        self._answer_through(completed, completed)

    def _answer_through(self, last: int, completed: int) -> None:
        """Answer the pending pulls of rounds up to ``last``; a round whose every pusher has its answer (or is
        being sent it) is released."""
        still_waiting = []
        bare_pulls = self.bare_pulls
        for identity, round_ in self.pending_pulls:
            if round_ > last:
                still_waiting.append((identity, round_))
                continue
            bare = False
            if bare_pulls and (identity, round_) in bare_pulls:
                bare_pulls.discard((identity, round_))
                bare = True
            self._answer(identity, round_, bare, completed)
            waiting = self.unanswered.get(round_)
            if waiting is not None:
                waiting.discard(identity)
                if not waiting:
                    del self.unanswered[round_]
                    self.engine.release(self.key, round_)
        self.pending_pulls = still_waiting

    def _answer(self, identity: bytes, round_: int, bare: bool, completed: int) -> None:
        if bare:
            result = None
        elif self.codec is None:
            result = self.engine.result(self.key, round_)
        else:
            result = self.codec.answers[round_]
        self._send_answer(identity, round_, result, 0)

    def _send_answer(self, identity: bytes, round_: int, result: Any, aux: int) -> None:
        """Send one pull its answer. The send holds a view of the engine's sum, so once the engine releases the
        round its buffer goes back to the pool only when the send is done."""
        if self.join_failed or self.abandoned:  # rare: most keys never fail a round
            failed = self.join_failed.get(round_) or self.abandoned.get(round_)
            if failed:
                self.send(Command.ERROR, self.rank, self.key, round_, payload=failed.encode(), identity=identity)
                return
        tracer = self.tracer
        sending = time.time() if tracer is not None and tracer.traces(round_) else 0.0
        self.send(Command.PULL_RESPONSE, self.rank, self.key, round_, payload=result, dtype=self.spec.dtype,
                  identity=identity, aux=aux)
        if wire_log.isEnabledFor(logging.DEBUG):
            wire_log.debug("ANSWER key %d round %d to worker %d (%s)", self.key, round_,
                           self.state.rank_of(identity), self.spec.name)
        if sending:
            tracer.span("answer", self.spec.name, sending, time.time(), key=self.key, partition=self.spec.partition,
                        worker=self.state.rank_of(identity), step=round_ + 1)

    # --- failures and stalls ----------------------------------------------------------------
    def fail_round(self, round_: int) -> None:
        self.pending_pulls = [(i, r) for i, r in self.pending_pulls if r != round_]
        self.bare_pulls = {(i, r) for i, r in self.bare_pulls if r != round_}
        self.unanswered.pop(round_, None)

    def partial_round(self) -> Optional[PartialRound]:
        if not self.pushed:
            return None
        return PartialRound(self.key, self.spec.name, self.engine.completed_round(self.key) + 1,
                            self.round_started, set(self.pushed))


def _cannot_skip(round_: int, described: str) -> str:
    return (f"skipped pull of round {round_} for {described}: only a closed round of a key with backup "
            "workers can be skipped")
