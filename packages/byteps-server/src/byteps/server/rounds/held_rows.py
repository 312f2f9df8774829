"""Server-held tables (docs/sparse.md): this server's rows of a table, looked up by id and stepped per round.

A key declared with ``PartitionSpec.held`` (a
:class:`~byteps.common.held_table.HeldTable`) is one server's shard of a
table that lives here, not on the workers: the rows whose ids hash to this
server. Two kinds of message reach it:

- a *lookup*: a PULL with FLAG_LOOKUP whose payload is row ids (int64,
  unique, ascending, within the table); answered at once with those rows
  as they are now, in PULL_RESPONSEs of whole (id, row) records that carry
  FLAG_LOOKUP and their count in ``aux``. A row never touched before is
  created as :func:`~byteps.common.held_table.initial_rows` makes it, from
  the table's seed and its id.
- a round's *update*: exactly a row-sparse push (:class:`SparseRowSum`'s
  rules: one push per machine, its rows summed by id on the machine, parts,
  FLAG_PULL on the last, a joined machine an empty push). When every
  machine has pushed, the rows are summed by id (divided by the number of
  workers where the pushes average), the optimizer steps each summed row
  once (SGD, Adagrad, or lazy Adam with per-row moments and step count),
  and each machine gets an empty answer: the round is applied.

A worker looks up the rows of its next step only after its update's answer
came back, so in a synchronous job every lookup sees every earlier round
applied. Rows are kept in growing arrays indexed through a sorted id list
(:class:`HeldRowStore`); only rows that were touched take memory.
"""

from __future__ import annotations

import logging
from typing import List, Optional, Tuple

import numpy as np

from byteps.common.dtypes import DType
from byteps.common.held_table import HeldTable, initial_rows
from byteps.common.row_sparse import encode_chunks
from byteps.server.rounds.key_state import KeyState, RoundServices
from byteps.server.rounds.sparse_rows import SparseRowSum
from byteps.transport import FLAG_AVERAGE, FLAG_LOOKUP, Command, Message

__all__ = ["HeldRowStore", "HeldRows"]

_ID = np.dtype("<i8")
log = logging.getLogger("byteps.server.rounds.held_rows")


class HeldRowStore:
    """The rows of one server's shard and their optimizer state, created on first touch.

    Example::

        store = HeldRowStore(HeldTable(optimizer="sgd", lr=0.5), row_size=4)
        store.lookup(np.array([2, 9]))                 # two fresh rows (from the seed), kept
        store.apply(np.array([9]), np.ones((1, 4), np.float32))
    """

    def __init__(self, held: HeldTable, row_size: int) -> None:
        self.held = held
        self.row_size = row_size
        self.ids = np.empty(0, np.int64)  # every row held, ascending
        self.slots = np.empty(0, np.int64)  # each one's slot in the arrays below
        self.count = 0
        self.rows = np.empty((0, row_size), np.float32)
        self.state = {name: np.empty((0, row_size), np.float32) for name in self._state_names()}
        self.steps = np.empty(0, np.int64)  # Adam: a row's updates so far

    def _state_names(self) -> Tuple[str, ...]:
        return {"sgd": (), "adagrad": ("sum",), "adam": ("m", "v")}[self.held.optimizer]

    def slots_of(self, ids: np.ndarray) -> np.ndarray:
        """The slots of ``ids`` (unique, ascending), rows created for those not held yet."""
        position = np.searchsorted(self.ids, ids)
        found = position < len(self.ids)
        found[found] = self.ids[position[found]] == ids[found]
        slots = np.empty(len(ids), np.int64)
        slots[found] = self.slots[position[found]]
        missing = ~found
        new = int(missing.sum())
        if new:
            fresh = np.arange(self.count, self.count + new, dtype=np.int64)
            self._grow(self.count + new)
            self.rows[fresh] = initial_rows(self.held, ids[missing], self.row_size)
            if "sum" in self.state:
                self.state["sum"][fresh] = self.held.initial_accumulator
            for name in ("m", "v"):
                if name in self.state:
                    self.state[name][fresh] = 0.0
            self.steps[fresh] = 0
            self.count += new
            slots[missing] = fresh
            self.ids = np.insert(self.ids, position[missing], ids[missing])
            self.slots = np.insert(self.slots, position[missing], fresh)
        return slots

    def _grow(self, needed: int) -> None:
        capacity = len(self.rows)
        if needed <= capacity:
            return
        capacity = max(needed, 2 * capacity, 1024)

        def grown(array: np.ndarray) -> np.ndarray:
            bigger = np.empty((capacity, *array.shape[1:]), array.dtype)
            bigger[:self.count] = array[:self.count]
            return bigger

        self.rows = grown(self.rows)
        self.state = {name: grown(array) for name, array in self.state.items()}
        self.steps = grown(self.steps)

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """A copy of the rows ``ids`` (unique, ascending) as they are now."""
        slots = self.slots_of(ids)  # first: it may grow the arrays
        return self.rows[slots]

    def apply(self, ids: np.ndarray, grads: np.ndarray) -> None:
        """One optimizer step of the rows ``ids`` (unique, ascending) with their gradients ``grads``."""
        slots = self.slots_of(ids)
        held, grads = self.held, grads.astype(np.float32, copy=False)
        if held.optimizer == "sgd":
            self.rows[slots] -= np.float32(held.lr) * grads
        elif held.optimizer == "adagrad":
            total = self.state["sum"][slots] + grads * grads
            self.state["sum"][slots] = total
            self.rows[slots] -= np.float32(held.lr) * grads / (np.sqrt(total) + np.float32(held.eps))
        else:  # lazy Adam: only the rows of this round move, each with its own step count
            beta1, beta2 = held.betas
            steps = self.steps[slots] + 1
            self.steps[slots] = steps
            m = np.float32(beta1) * self.state["m"][slots] + np.float32(1 - beta1) * grads
            v = np.float32(beta2) * self.state["v"][slots] + np.float32(1 - beta2) * grads * grads
            self.state["m"][slots], self.state["v"][slots] = m, v
            correction1 = (1 - beta1 ** steps.astype(np.float64))[:, None]
            correction2 = (1 - beta2 ** steps.astype(np.float64))[:, None]
            step = held.lr * (m / correction1) / (np.sqrt(v / correction2) + held.eps)
            self.rows[slots] -= step.astype(np.float32)


class HeldRows(SparseRowSum):
    """One server's shard of a server-held table: lookups answered now, rounds summed by id then applied."""

    def __init__(self, state: KeyState, services: RoundServices) -> None:
        super().__init__(state, services)
        spec = state.spec
        if self.dtype is not DType.FLOAT32:
            raise ValueError(f"{spec.describe()}: a server-held table is float32")
        self.held = HeldTable.from_wire(spec.held)
        self.store = HeldRowStore(self.held, int(np.prod(self.row_shape, dtype=np.int64)))
        self.workers = services.num_machines * services.local_size

    # --- a round: summed by id, then applied ------------------------------------------
    def _answer_of(self, round_: int, union: np.ndarray, sums: np.ndarray) -> List[Optional[np.ndarray]]:
        """Step the round's summed rows (averaged over the workers where the pushes average); nothing to send
        back but the news that the round is applied."""
        grads = sums.reshape(len(union), self.store.row_size)
        if self.round_flags & FLAG_AVERAGE:
            grads = grads / np.float32(self.workers)
        self.store.apply(union, grads)
        return [None]

    # --- lookups --------------------------------------------------------------------------
    def pull(self, message: Message) -> None:
        header = message.header
        if not header.flags & FLAG_LOOKUP:
            super().pull(message)
            return
        try:
            ids = self._lookup_ids(message)
            rows = self.store.lookup(ids).reshape((len(ids), *self.row_shape))
            payloads = encode_chunks(ids, rows, self.services.max_payload_bytes,
                                     f"lookup of {self.spec.describe()}")
        except ValueError as exc:  # the asker alone fails (its ERROR flagged, so that no round takes it)
            log.error("refused a lookup of key %d from worker %d: %s", self.key, header.sender, exc)
            self.send(Command.ERROR, self.rank, self.key, header.round, payload=str(exc).encode(),
                      flags=FLAG_LOOKUP, identity=message.identity)
            return
        for payload in payloads:
            self.send(Command.PULL_RESPONSE, self.rank, self.key, header.round, payload=payload,
                      dtype=self.spec.dtype, flags=FLAG_LOOKUP, aux=len(payloads), identity=message.identity)

    def _lookup_ids(self, message: Message) -> np.ndarray:
        data = message.payload
        raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.empty(0, np.uint8)
        if raw.nbytes % _ID.itemsize:
            raise ValueError(f"worker {message.header.sender}: a lookup of {self.spec.describe()} carries "
                             f"{raw.nbytes} bytes, not whole int64 ids")
        ids = raw.view(_ID)
        if len(ids) and (ids[0] < 0 or ids[-1] >= self.num_rows or not np.all(ids[1:] > ids[:-1])):
            raise ValueError(f"worker {message.header.sender}: row ids looked up in {self.spec.describe()} must "
                             f"be unique, ascending and within [0, {self.num_rows})")
        return ids
