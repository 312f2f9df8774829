"""How fast a server-held table's shard finds and creates rows by id: the hash index against a sorted id array.

A server keeps a held table's rows in arrays and finds them by id
(docs/sparse.md, "Tables held by the servers"). The first version kept a
sorted id array (binary search; ``np.insert`` of each batch of new ids,
which copies the whole index); byteps-server now uses
``rounds.row_index.RowIndex``, an open-addressing hash index. Both run
here in one process on the same batches: a table filled from empty in
batches of ``--batch`` ids (half of them new, half already held: a CTR
batch touches hot rows again), timed per million rows held so far.

    python benchmarks/bench_row_index.py --rows 5000000 --batch 2000
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from byteps.server.rounds.row_index import RowIndex


class SortedIndex:
    """The first version's index: ids ascending, each one's slot beside it (the baseline)."""

    def __init__(self) -> None:
        self.ids = np.empty(0, np.int64)
        self.slots = np.empty(0, np.int64)

    def find(self, ids: np.ndarray) -> np.ndarray:
        position = np.searchsorted(self.ids, ids)
        found = position < len(self.ids)
        found[found] = self.ids[position[found]] == ids[found]
        slots = np.full(len(ids), -1, np.int64)
        slots[found] = self.slots[position[found]]
        return slots

    def insert(self, ids: np.ndarray, slots: np.ndarray) -> None:
        position = np.searchsorted(self.ids, ids)
        self.ids = np.insert(self.ids, position, ids)
        self.slots = np.insert(self.slots, position, slots)


def fill(index, batches) -> list:
    """Seconds per batch, finding each batch's ids and inserting the new ones."""
    times, count = [], 0
    for ids in batches:
        started = time.perf_counter()
        slots = index.find(ids)
        new = ids[slots < 0]
        index.insert(new, np.arange(count, count + len(new)))
        count += len(new)
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000, help="rows held at the end")
    parser.add_argument("--batch", type=int, default=2000, help="ids per batch (half new)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    fresh = rng.permutation(np.arange(args.rows, dtype=np.int64) * 7919 + 13)  # distinct, scattered ids
    half = args.batch // 2
    batches = []
    for start in range(0, args.rows, half):
        new = fresh[start:start + half]
        old = fresh[rng.integers(0, max(start, 1), half)] if start else new
        batches.append(np.unique(np.concatenate([new, old])))
    results = {}
    for name, index in (("sorted array", SortedIndex()), ("hash index", RowIndex())):
        results[name] = np.array(fill(index, batches))
    marks = [m for m in (1_000_000, 2_000_000, 5_000_000, 10_000_000, 20_000_000) if m <= args.rows]
    print(f"{args.rows:,} rows in batches of {args.batch} ids (half new); seconds per million rows created, "
          "by rows already held")
    print(f"{'rows held':>12} {'sorted array':>14} {'hash index':>12} {'speed-up':>9}")
    low = 0
    for mark in marks:
        batch_range = slice(low // half, mark // half)
        sorted_s = results["sorted array"][batch_range].sum() / ((mark - low) / 1e6)
        hashed_s = results["hash index"][batch_range].sum() / ((mark - low) / 1e6)
        print(f"{low / 1e6:>5.1f}-{mark / 1e6:<5.1f}M {sorted_s:>14.2f} {hashed_s:>12.2f} {sorted_s / hashed_s:>8.1f}x")
        low = mark
    total = {name: times.sum() for name, times in results.items()}
    print(f"{'whole fill':>12} {total['sorted array']:>13.1f}s {total['hash index']:>11.1f}s "
          f"{total['sorted array'] / total['hash index']:>8.1f}x")


if __name__ == "__main__":
    main()
