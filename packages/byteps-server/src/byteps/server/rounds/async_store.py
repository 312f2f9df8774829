"""Asynchronous keys (BYTEPS_ENABLE_ASYNC, docs/async.md): a store that every push updates as it comes.

Round 0 of an asynchronous key is a synchronous broadcast (the sum of the
root's parameters and the other workers' zeros, :class:`~byteps.server.rounds.sync_sum.SyncSum`'s
round); its result becomes the key's *store*. Every later push is a delta,
added to the store as it arrives (each worker's in order, each once: round
r of a worker must follow its round r - 1), and a pull is answered with a
copy of the store at once, or, with BYTEPS_ASYNC_MAX_STALENESS=s, once the
slowest worker is at most s pushes behind the puller.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np

from byteps.server.rounds.key_state import KeyState, RoundServices
from byteps.server.rounds.sync_sum import SyncSum
from byteps.transport import Command, Message
from byteps.transport.frames import FLAG_PULL

__all__ = ["AsyncStore"]


class AsyncStore(SyncSum):
    """An asynchronous key: a synchronous round 0 fills the store, later pushes are deltas added to it."""

    def __init__(self, state: KeyState, services: RoundServices) -> None:
        super().__init__(state, services)
        self.store: Optional[np.ndarray] = None  # the key's parameters (uint8), from its round-0 broadcast on
        self.applied: Dict[bytes, int] = {}  # identity -> deltas added (its last round pushed)
        self.held_pulls: List[Tuple[bytes, int]] = []  # (identity, round) past the staleness bound

    def push(self, message: Message) -> None:
        header = message.header
        if header.round == 0:  # the initial broadcast
            super().push(message)
            return
        expected = self.applied.get(message.identity, 0) + 1
        if header.round != expected or self.store is None:
            raise ValueError(f"asynchronous push of round {header.round} for {self.spec.describe()}: expected "
                             f"round {expected}, after the initial broadcast (round 0) completed")
        payload = message.payload if message.payload is not None else b""
        if len(payload) != self.spec.nbytes:
            raise ValueError(f"push of {len(payload)} bytes for {self.spec.describe()}")
        self.engine.reduce_into(self.store, payload, self.spec.dtype)
        self.applied[message.identity] = header.round
        self.services.async_pushes += 1
        if not header.flags & FLAG_PULL:
            self.send(Command.PUSH_ACK, self.rank, self.key, header.round, identity=message.identity)
        if self.held_pulls:
            self._answer_store_pulls()

    def _keep(self, round_: int) -> None:
        if self.store is None:  # the initial broadcast: the store begins with it
            self.store = np.frombuffer(self.engine.result(self.key, round_), dtype=np.uint8).copy()
        super()._keep(round_)

    def pull(self, message: Message) -> None:
        header = message.header
        if header.round == 0:
            super().pull(message)
            return
        if self.applied.get(message.identity, 0) < header.round:
            raise ValueError(f"pull of round {header.round} for {self.spec.describe()} before its push")
        self.held_pulls.append((message.identity, header.round))
        self._answer_store_pulls()

    def is_waiting(self, identity: bytes, round_: int) -> bool:
        return super().is_waiting(identity, round_) or (identity, round_) in self.held_pulls

    def _answer_store_pulls(self) -> None:
        """Answer the pulls within BYTEPS_ASYNC_MAX_STALENESS of the slowest worker, with the store as it is."""
        bound = self.services.async_max_staleness
        slowest = min(self.applied.get(identity, 0) for identity in self.state.declared_by)
        waiting = []
        for identity, round_ in self.held_pulls:
            if bound is not None and round_ - slowest > bound:
                waiting.append((identity, round_))
                continue
            # A copy: the store changes with the next push while this answer may still be queued.
            self.send(Command.PULL_RESPONSE, self.rank, self.key, round_, payload=self.store.tobytes(),
                      dtype=self.spec.dtype, identity=identity)
        self.held_pulls = waiting
