"""Where a server-held table's rows are: row id -> slot, an open-addressing hash table in numpy arrays.

:class:`~byteps.server.rounds.held_rows.HeldRowStore` keeps a shard's rows
in arrays that grow at the end, in the order rows were first touched; this
index finds a row's slot from its id. A sorted id array (binary search,
``np.insert`` of each batch of new ids) costs a copy of the whole index per
batch that creates rows: at tens of millions of rows and small batches that
copy dominates a lookup. Here a batch costs its own size: ids are hashed
(splitmix64's finalizer) into a power-of-two table of (id, slot) pairs kept
at most half full, probed linearly, every step vectorized over the batch;
the table doubles (every id placed again) when it would pass half full.
16 bytes per row at the worst load, 32 after a doubling.

Example::

    index = RowIndex()
    index.find(np.array([7, 9]))            # [-1, -1]: not held
    index.insert(np.array([7, 9]), np.array([0, 1]))
    index.find(np.array([9, 5]))            # [1, -1]
"""

from __future__ import annotations

import numpy as np

__all__ = ["RowIndex"]

_EMPTY = np.int64(-1)  # ids are never negative
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _hash(ids: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer of each id (uint64): neighbouring ids land far apart."""
    x = ids.astype(np.uint64)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= _MIX1
        x ^= x >> np.uint64(27)
        x *= _MIX2
        x ^= x >> np.uint64(31)
    return x


class RowIndex:
    """Row id (int64, >= 0) -> slot (int64), for ids inserted once each."""

    def __init__(self, capacity: int = 1024) -> None:
        size = 1 << max(10, int(capacity - 1).bit_length())
        self.keys = np.full(size, _EMPTY, np.int64)
        self.values = np.empty(size, np.int64)
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def find(self, ids: np.ndarray) -> np.ndarray:
        """The slot of each of ``ids`` (any order, repeats allowed), -1 for an id not held."""
        ids = np.asarray(ids, np.int64)
        mask = np.uint64(len(self.keys) - 1)
        position = (_hash(ids) & mask).astype(np.int64)
        found = np.full(len(ids), -1, np.int64)
        todo = np.arange(len(ids))
        while len(todo):
            at = position[todo]
            keys = self.keys[at]
            hit = keys == ids[todo]
            found[todo[hit]] = self.values[at[hit]]
            todo = todo[~hit & (keys != _EMPTY)]  # an empty slot ends the probe: not held
            position[todo] = (position[todo] + 1) & int(mask)
        return found

    def insert(self, ids: np.ndarray, slots: np.ndarray) -> None:
        """Hold ``ids`` (unique, none held yet) at ``slots``."""
        ids, slots = np.asarray(ids, np.int64), np.asarray(slots, np.int64)
        if 2 * (self.count + len(ids)) > len(self.keys):
            self._grow(2 * (self.count + len(ids)))
        self._place(ids, slots)
        self.count += len(ids)

    def _place(self, ids: np.ndarray, slots: np.ndarray) -> None:
        """Put each id (none held) in the first free pair of its probe sequence."""
        mask = len(self.keys) - 1
        position = (_hash(ids) & np.uint64(mask)).astype(np.int64)
        todo = np.arange(len(ids))
        while len(todo):
            at = position[todo]
            free = np.flatnonzero(self.keys[at] == _EMPTY)
            _, first = np.unique(at[free], return_index=True)  # of the ids at one free pair, the first takes it
            winners = free[first]
            self.keys[at[winners]] = ids[todo[winners]]
            self.values[at[winners]] = slots[todo[winners]]
            left = np.ones(len(todo), bool)
            left[winners] = False
            todo = todo[left]  # each at a pair taken now (before, or by a winner): the next one
            position[todo] = (position[todo] + 1) & mask

    def _grow(self, needed: int) -> None:
        held = self.keys != _EMPTY
        ids, slots = self.keys[held], self.values[held]
        size = 1 << max(10, int(needed - 1).bit_length())
        self.keys = np.full(size, _EMPTY, np.int64)
        self.values = np.empty(size, np.int64)
        self._place(ids, slots)
