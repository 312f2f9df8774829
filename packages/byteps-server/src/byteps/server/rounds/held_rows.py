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
applied. Rows are kept in growing arrays, in the order they were first
touched, and found by id through a hash index
(:class:`~byteps.server.rounds.row_index.RowIndex`); only rows that were
touched take memory.
"""

from __future__ import annotations

import glob
import json
import logging
import os
from typing import Dict, List, Optional, Tuple

import numpy as np

from byteps.common.dtypes import DType
from byteps.common.held_table import LOAD, LOOKUP, SAVE, HeldTable, initial_rows, shard_file, shard_glob
from byteps.common.row_sparse import encode_chunks, server_of
from byteps.server.rounds.key_state import KeyState, RoundServices
from byteps.server.rounds.row_index import RowIndex
from byteps.server.rounds.sparse_rows import SparseRowSum
from byteps.transport import FLAG_AVERAGE, FLAG_LOOKUP, Command, Message
from byteps.transport.frames import parse_json_payload

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
        self.index = RowIndex()  # row id -> slot in the arrays below
        self.count = 0
        self.row_ids = np.empty(0, np.int64)  # the id of each slot's row
        self.rows = np.empty((0, row_size), np.float32)
        self.state = {name: np.empty((0, row_size), np.float32) for name in self._state_names()}
        self.steps = np.empty(0, np.int64)  # Adam: a row's updates so far

    def _state_names(self) -> Tuple[str, ...]:
        return {"sgd": (), "adagrad": ("sum",), "adam": ("m", "v")}[self.held.optimizer]

    def slots_of(self, ids: np.ndarray) -> np.ndarray:
        """The slots of ``ids`` (unique), rows created for those not held yet."""
        slots = self.index.find(ids)
        missing = slots < 0
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
            self.row_ids[fresh] = ids[missing]
            self.count += new
            slots[missing] = fresh
            self.index.insert(ids[missing], fresh)
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
        self.row_ids = grown(self.row_ids)

    def export(self) -> Dict[str, np.ndarray]:
        """Every row held, ascending by id, with its optimizer state: what a saved shard holds."""
        slots = np.argsort(self.row_ids[:self.count], kind="stable")
        return {"ids": self.row_ids[slots], "rows": self.rows[slots], "steps": self.steps[slots],
                **{f"state_{name}": array[slots] for name, array in self.state.items()}}

    def replace(self, saved: Dict[str, np.ndarray]) -> None:
        """Hold exactly the rows of ``saved`` (an :meth:`export`'s arrays, ids ascending), nothing else."""
        count = len(saved["ids"])
        self.count = 0
        self.rows = np.empty((0, self.row_size), np.float32)
        self.state = {name: np.empty((0, self.row_size), np.float32) for name in self._state_names()}
        self.steps = np.empty(0, np.int64)
        self.row_ids = np.empty(0, np.int64)
        self._grow(count)
        self.rows[:count] = saved["rows"]
        self.steps[:count] = saved["steps"]
        for name in self.state:
            self.state[name][:count] = saved[f"state_{name}"]
        self.count = count
        self.row_ids[:count] = saved["ids"]
        self.index = RowIndex(2 * count)
        self.index.insert(self.row_ids[:count], np.arange(count, dtype=np.int64))

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

    # --- lookups, saving and loading -------------------------------------------------------
    def pull(self, message: Message) -> None:
        header = message.header
        if not header.flags & FLAG_LOOKUP:
            super().pull(message)
            return
        try:
            if header.aux == LOOKUP:
                ids = self._lookup_ids(message)
                rows = self.store.lookup(ids).reshape((len(ids), *self.row_shape))
                payloads = encode_chunks(ids, rows, self.services.max_payload_bytes,
                                         f"lookup of {self.spec.describe()}")
            elif header.aux in (SAVE, LOAD):
                request = parse_json_payload(message.payload if message.payload is not None else b"")
                (self._save if header.aux == SAVE else self._load)(str(request["directory"]),
                                                                   int(request["servers"]))
                payloads = [None]
            else:
                raise ValueError(f"worker {header.sender}: unknown request {header.aux} (aux) of a lookup")
        except (ValueError, OSError, KeyError, TypeError) as exc:  # the asker alone fails (ERROR flagged)
            log.error("refused a lookup of key %d from worker %d: %s", self.key, header.sender, exc)
            self.send(Command.ERROR, self.rank, self.key, header.round, payload=str(exc).encode(),
                      flags=FLAG_LOOKUP, identity=message.identity)
            return
        for payload in payloads:
            self.send(Command.PULL_RESPONSE, self.rank, self.key, header.round, payload=payload,
                      dtype=self.spec.dtype, flags=FLAG_LOOKUP, aux=len(payloads), identity=message.identity)

    def _save(self, directory: str, servers: int) -> None:
        """This server's shard to ``directory`` (written aside, then renamed: a reader never sees half)."""
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, shard_file(self.spec.name, self.rank, servers))
        partial = path + ".partial.npz"
        np.savez(partial, held=np.array(json.dumps(self.held.wire())), num_rows=np.array(self.num_rows),
                 row_shape=np.array(self.row_shape, np.int64), **self.store.export())
        os.replace(partial, path)
        log.info("saved %d rows of %s to %s", self.store.count, self.spec.describe(), path)

    def _load(self, directory: str, servers: int) -> None:
        """The rows this server owns (of ``servers``) among every shard saved in ``directory``, whatever the
        number of servers that saved them, in place of the rows it holds."""
        found = sorted(path for path in glob.glob(os.path.join(glob.escape(directory), shard_glob(self.spec.name)))
                       if not path.endswith(".partial.npz"))
        counts = {int(path.rsplit("-of-", 1)[1][:-4]) for path in found}
        if len(counts) != 1 or len(found) != next(iter(counts)):
            saved_by = f" saved by {sorted(counts)} servers" if counts else ""
            raise ValueError(f"load of {self.spec.describe()}: {directory} holds {len(found)} shard file(s) of "
                             f"it{saved_by}; one whole save expected")
        parts: Dict[str, List[np.ndarray]] = {}
        for path in found:
            with np.load(path) as saved:
                if json.loads(str(saved["held"])) != self.held.wire() or int(saved["num_rows"]) != self.num_rows \
                        or tuple(saved["row_shape"]) != tuple(self.row_shape):
                    raise ValueError(f"load of {self.spec.describe()}: {path} was saved from a table with other "
                                     "rows, row shape or optimizer")
                mine = server_of(saved["ids"], servers) == self.rank
                for field in saved.files:
                    if field not in ("held", "num_rows", "row_shape"):
                        parts.setdefault(field, []).append(saved[field][mine])
        merged = {field: np.concatenate(arrays) for field, arrays in parts.items()}
        order = np.argsort(merged["ids"], kind="stable")
        self.store.replace({field: array[order] for field, array in merged.items()})
        log.info("loaded %d rows of %s from %s", self.store.count, self.spec.describe(), directory)

    def _lookup_ids(self, message: Message) -> np.ndarray:
        data = message.payload
        raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.empty(0, np.uint8)
        if raw.nbytes % _ID.itemsize:
            raise ValueError(f"worker {message.header.sender}: a lookup of {self.spec.describe()} carries "
                             f"{raw.nbytes} bytes, not whole int64 ids")
        ids = raw.view(_ID)
        try:
            self._check_ids(ids, "looked up in")
        except ValueError as exc:
            raise ValueError(f"worker {message.header.sender}: {exc}") from None
        return ids
