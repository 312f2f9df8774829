"""RowIndex, a server-held table's id -> slot hash index, against a dict."""

import numpy as np

from byteps.common.held_table import HeldTable
from byteps.server.rounds.held_rows import HeldRowStore
from byteps.server.rounds.row_index import RowIndex


def test_finds_every_id_inserted_and_no_other_through_many_doublings():
    rng = np.random.default_rng(0)
    index, held, next_slot = RowIndex(), {}, 0
    for batch in range(200):
        high = 5000 if batch % 2 else 1 << 62  # dense ids (colliding hashes' neighbours) and sparse ones
        ids = rng.integers(0, high, int(rng.integers(1, 3000)))  # repeats allowed in a find
        found = index.find(ids)
        np.testing.assert_array_equal(found, [held.get(i, -1) for i in ids.tolist()], err_msg=f"batch {batch}")
        new = np.unique(ids[found < 0])
        slots = np.arange(next_slot, next_slot + len(new))
        index.insert(new, slots)
        held.update(zip(new.tolist(), slots.tolist()))
        next_slot += len(new)
    assert len(index) == len(held) and 2 * len(index) <= len(index.keys)


def test_a_store_exports_by_id_and_replaces_through_the_index():
    store = HeldRowStore(HeldTable("sgd", lr=1.0, seed=2), row_size=2)
    store.apply(np.array([9, 3]), np.ones((2, 2), np.float32))
    store.lookup(np.array([5]))
    saved = store.export()
    assert saved["ids"].tolist() == [3, 5, 9]
    again = HeldRowStore(HeldTable("sgd", lr=1.0, seed=2), row_size=2)
    again.replace(saved)
    np.testing.assert_array_equal(again.lookup(np.array([9, 3, 5])), store.lookup(np.array([9, 3, 5])))
    assert again.count == 3
