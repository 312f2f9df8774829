"""Worker of test_sparse_push_pull.py: row-sparse push_pulls of random ids, checked against numpy.

Usage: python sparse_worker.py sums ROUNDS | python sparse_worker.py bad CASE

``sums``: every round, each rank pushes random ids of three tables (float32
rows of 4, float64 rows of 2x3 averaged, float16 rows of 8), duplicates
included, some ranks with no ids at all, one round where no rank has any.
Every rank derives every other rank's input from the same seeds, so it
computes the numpy reference itself (the union of ids, each id's rows
summed in float64) and compares. Prints ``SPARSE OK rank R``.

``bad``: one bad input (CASE), then a good round of the same table and of
another one, which must work: the servers survived and nobody waits on
the bad round. Prints ``BAD OK rank R``.
"""

from __future__ import annotations

import sys
import zlib
from typing import Tuple

import numpy as np

import byteps.common as bps
from byteps.common import PushPullError
from byteps.common.api import worker

#: name -> (rows, row shape, dtype, average)
TABLES = {"emb.small": (50, (4,), np.float32, False), "emb.cube": (1000, (2, 3), np.float64, True),
          "emb.half": (30, (8,), np.float16, False)}
WAIT_S = 20.0  # no round of a few rows takes this long: longer is a hang


def gradient(name: str, rank: int, round_: int) -> Tuple[np.ndarray, np.ndarray]:
    num_rows, row_shape, dtype, _ = TABLES[name]
    rng = np.random.default_rng(zlib.crc32(f"{name}:{rank}:{round_}".encode()))
    count = 0 if round_ == 2 or (rank + round_) % 4 == 3 else int(rng.integers(1, 40))
    ids = rng.integers(0, num_rows, size=count)  # duplicates are likely: rows of one id are summed first
    rows = rng.uniform(-1, 1, size=(count, *row_shape)).astype(dtype)
    return ids, rows


def reference(name: str, size: int, round_: int, active=None) -> Tuple[np.ndarray, np.ndarray]:
    """The round's sum over the ``active`` ranks (every rank by default), averaged over all ``size``."""
    _, row_shape, _, average = TABLES[name]
    sums = {}
    for rank in range(size) if active is None else active:
        ids, rows = gradient(name, rank, round_)
        for i, row in zip(ids.tolist(), rows.astype(np.float64)):
            sums[i] = sums.get(i, 0.0) + row
    ids = np.array(sorted(sums), dtype=np.int64)
    rows = np.array([sums[i] for i in ids]).reshape((len(ids), *row_shape))
    return ids, rows / size if average else rows


def sums(rounds: int) -> None:
    me, n = bps.rank(), bps.size()
    for round_ in range(rounds):
        handles = {}
        for name, (num_rows, row_shape, _, average) in TABLES.items():
            ids, rows = gradient(name, me, round_)
            handles[name] = worker().sparse_push_pull_async(ids, rows, name, num_rows, row_shape, average)
        for name, handle in handles.items():
            ids, rows = handle.wait(WAIT_S)
            want_ids, want_rows = reference(name, n, round_)
            assert ids.dtype == np.int64 and rows.dtype == TABLES[name][2], (name, ids.dtype, rows.dtype)
            np.testing.assert_array_equal(ids, want_ids, err_msg=f"{name} round {round_}")
            tolerance = 1e-2 if rows.dtype == np.float16 else 1e-5
            np.testing.assert_allclose(rows.astype(np.float64), want_rows, rtol=tolerance, atol=tolerance,
                                       err_msg=f"{name} round {round_}")
            if round_ == 2:
                assert len(ids) == 0 and rows.shape == (0, *TABLES[name][1]), (name, ids, rows.shape)
    huge_rows = 10 ** 8  # 6.4 GB dense: only the rows touched may cross the wire
    before = worker().bytes_sent, worker().bytes_received
    ids, rows = worker().sparse_push_pull(np.array([huge_rows - 1, 7 * me, 7 * me]), np.ones((3, 16), np.float32),
                                          "emb.huge", huge_rows, (16,))
    assert ids.tolist() == sorted({7 * r for r in range(n)} | {huge_rows - 1}), ids
    assert rows.tolist() == [[n if i == huge_rows - 1 else 2] * 16 for i in ids.tolist()], rows  # id 7r twice
    sent, received = worker().bytes_sent - before[0], worker().bytes_received - before[1]
    record = 8 + 16 * 4
    headers = 2 * 40 * len(worker().server_addresses) + 1000  # INIT_KEYs (JSON) and headers
    local_size = worker().local_size
    if local_size > 1 and worker().sparse.tables["emb.huge"].table_id % local_size != worker().local_rank:
        # not the table's local root: its rows went to the root, which pushed the machine's sum
        assert sent == received == 0, (sent, received)
    else:  # this process's rows, or its machine's summed by id: the shared last row once
        assert sent <= (local_size + 1) * record + headers and received <= (n + 1) * record + headers, (sent,
                                                                                                      received)
    print(f"SPARSE OK rank {me}", flush=True)


def joined(rounds: int) -> None:
    """Ranks run out of data at different rounds and join (hvd.join()): each round's sums hold the rows of the
    ranks still running and average over every rank; a local root that joined stands in for its machine's
    other ranks. After the join every rank takes one more round, all together."""
    me, n = bps.rank(), bps.size()
    rounds_of = [rounds - 2 * ((rank + 1) % n) for rank in range(n)]  # rank n-1 runs longest, rank 0 next

    def one_round(round_: int, active) -> None:
        handles = {name: worker().sparse_push_pull_async(*gradient(name, me, round_), name, num_rows, row_shape,
                                                          average)
                   for name, (num_rows, row_shape, _, average) in TABLES.items()}
        for name, handle in handles.items():
            ids, rows = handle.wait(WAIT_S)
            want_ids, want_rows = reference(name, n, round_, active)
            np.testing.assert_array_equal(ids, want_ids, err_msg=f"rank {me}: {name} round {round_}")
            tolerance = 1e-2 if rows.dtype == np.float16 else 1e-5
            np.testing.assert_allclose(rows.astype(np.float64), want_rows, rtol=tolerance, atol=tolerance,
                                       err_msg=f"rank {me}: {name} round {round_}")

    for round_ in range(rounds_of[me]):
        one_round(round_, [rank for rank in range(n) if rounds_of[rank] > round_])
    last = worker().join()[0]
    assert last == n - 1, f"rank {me}: the last to join was {last}"
    one_round(rounds, range(n))  # every table's next round, on every rank: the rounds agree again
    print(f"JOINED OK rank {me}", flush=True)


def large(rounds: int) -> None:
    """Rounds of about 3 MB of rows per worker and server, each more than one message carries (the payload limit
    is 1 MiB): pushes and answers go in parts, and the sums are still numpy's."""
    me, n = bps.rank(), bps.size()
    num_rows, row_shape = 100_000, (256,)

    def rows_of(rank: int, round_: int):
        rng = np.random.default_rng(1000 * rank + round_)
        ids = rng.integers(0, 6000, size=3000)  # overlapping between ranks, duplicates within one
        return ids, rng.uniform(-1, 1, size=(len(ids), *row_shape)).astype(np.float32)

    for round_ in range(rounds):
        assert rows_of(me, round_)[1].nbytes > 2 * worker().config.max_partition_bytes
        ids, rows = worker().sparse_push_pull(*rows_of(me, round_), "emb.wide", num_rows, row_shape, average=True)
        sums = {}
        for rank in range(n):
            for i, row in zip(*rows_of(rank, round_)):
                sums[int(i)] = sums.get(int(i), 0.0) + row.astype(np.float64)
        want_ids = np.array(sorted(sums), dtype=np.int64)
        np.testing.assert_array_equal(ids, want_ids, err_msg=f"round {round_}")
        np.testing.assert_allclose(rows, np.array([sums[i] for i in want_ids]) / n, rtol=1e-5, atol=1e-5)
    print(f"LARGE OK rank {me}", flush=True)


def expect_failure(call, kind, text: str) -> None:
    try:
        call()
    except kind as exc:
        assert text in str(exc), f"expected {text!r} in: {exc}"
        print(f"rank {bps.rank()} refused as expected: {exc}", flush=True)
        return
    raise AssertionError(f"no {kind.__name__} ({text!r})")


def bad(case: str) -> None:
    me, n = bps.rank(), bps.size()
    good_ids, good_rows = np.array([1, 4, 4]), np.ones((3, 4), np.float32)

    def push(ids=good_ids, rows=good_rows, name="t", num_rows=10, row_shape=(4,)):
        return worker().sparse_push_pull_async(ids, rows, name, num_rows, row_shape).wait(WAIT_S)

    # The calling rank's own mistake: ValueError there, the round fails on the others (naming the cause).
    one_rank = {
        "out_of_range": (dict(ids=np.array([1, 10, 4])), "row ids must lie in [0, 10)"),
        "negative": (dict(ids=np.array([-1, 2, 4])), "row ids must lie in [0, 10)"),
        "dtype": (dict(rows=np.ones((3, 4), np.int32)), "a row-sparse push_pull takes float32"),
        "row_shape": (dict(rows=np.ones((3, 5), np.float32)), "rows of shape (3, 5)"),
    }
    if case in one_rank:
        push()  # a good first round: the table is known everywhere
        bad_args, text = one_rank[case]
        culprit = n - 1
        if me == culprit:
            expect_failure(lambda: push(**bad_args), ValueError, text)
        else:
            expect_failure(push, PushPullError, text)
    elif case == "first_use":  # refused at the table's very first use, before any server knows the table
        if me == n - 1:
            expect_failure(lambda: push(rows=np.ones((3, 4), np.int32)), ValueError, "push_pull takes float32")
        else:
            expect_failure(push, PushPullError, "push_pull takes float32")
    elif case == "reused":  # a table name used again with another row shape (or rows): every rank's own mistake
        push()
        expect_failure(lambda: push(rows=np.ones((3, 2), np.float32), row_shape=(2,)), ValueError,
                       "the name was first used for row-sparse table 't' (10 rows of shape 4")
    elif case == "disagree":  # ranks declare one table with different shapes: an error on every rank
        expect_failure(lambda: push(num_rows=10 + me), PushPullError, "mismatch")
    elif case == "one_disagrees":  # all but rank 1 agree: whoever declared first, every rank fails the round
        expect_failure(lambda: push(num_rows=10 + (me == 1)), PushPullError, "mismatch")
    else:
        raise SystemExit(f"unknown case {case}")
    if "disagree" not in case:
        ids, rows = push()  # the table goes on: the next round is whole on every rank
        assert ids.tolist() == [1, 4] and rows.tolist() == [[n] * 4, [2 * n] * 4], (ids, rows)
    ids, rows = push(name="u")  # and another table works: the servers are alive
    assert ids.tolist() == [1, 4] and rows.tolist() == [[n] * 4, [2 * n] * 4], (ids, rows)
    print(f"BAD OK rank {me}", flush=True)


def main() -> None:
    bps.init()
    if sys.argv[1] == "sums":
        sums(int(sys.argv[2]))
    elif sys.argv[1] == "large":
        large(int(sys.argv[2]))
    elif sys.argv[1] == "joined":
        joined(int(sys.argv[2]))
    else:
        bad(sys.argv[2])
    bps.shutdown()


if __name__ == "__main__":
    main()
