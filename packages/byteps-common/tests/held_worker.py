"""Worker of test_held_tables.py: a table held by the servers, looked up and updated, checked against numpy.

Usage: python held_worker.py train ROUNDS OPTIMIZER | python held_worker.py bad CASE |
       python held_worker.py save DIR ROUNDS AT | python held_worker.py resume DIR ROUNDS AT |
       python held_worker.py async ROUNDS [STALENESS]

``train``: every round each rank looks up random ids of the table (repeats
included, some ranks none), checks the rows against a reference table kept
here (rows start from ``initial_rows``; each round's gradients of every
rank summed by id, averaged over the ranks, and the optimizer applied in
float64 with per-row state), then pushes its gradients for those ids.
Every rank derives every other rank's input from the same seeds, so each
keeps the whole reference. Prints ``HELD OK rank R``.

``bad``: one bad call (CASE), then a good round, which must work. Prints
``BAD OK rank R``.

``save``: ROUNDS Adam rounds of the same batches, the table saved to DIR
(by rank 0) before round AT; ``resume``: the table loaded from DIR (by
rank 0, with any number of servers), then rounds AT to ROUNDS. Both print
``FINAL <rows>`` on rank 0: the rows of every id the batches touched,
which must be the same (rows and Adam's per-row state both restored).

``async`` (BYTEPS_ENABLE_ASYNC=1): ROUNDS SGD rounds, the last rank
slower than the others; each rank also steps a marker row of its own by
1 every round, so a marker's row tells how many of its rank's pushes were
applied. With STALENESS s (BYTEPS_ASYNC_MAX_STALENESS), after each update
every rank checks that every rank's pushes up to s rounds behind its own
were applied. At the end every row must hold every rank's every gradient
once, not averaged. Prints ``ASYNC OK rank R lag L`` (L: the largest lag
seen).
"""

from __future__ import annotations

import json
import sys
import time
import zlib
from typing import Dict, Tuple

import numpy as np

import byteps.common as bps
from byteps.common import PushPullError
from byteps.common.api import worker
from byteps.common.held_table import HeldTable, initial_rows

NUM_ROWS, ROW = 5000, (2, 3)
WAIT_S = 20.0
HELD = {"sgd": HeldTable("sgd", lr=0.5, seed=11, init_std=0.1),
        "adagrad": HeldTable("adagrad", lr=0.3, seed=12, init_std=0.1, initial_accumulator=0.1),
        "adam": HeldTable("adam", lr=0.05, seed=13, init_std=0.1, betas=(0.8, 0.95))}


def batch(rank: int, round_: int) -> Tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(zlib.crc32(f"held:{rank}:{round_}".encode()))
    count = 0 if (rank + round_) % 5 == 4 else int(rng.integers(1, 60))
    ids = np.concatenate([rng.integers(0, NUM_ROWS, size=count), rng.integers(0, 20, size=count // 3)])
    grads = rng.uniform(-1, 1, size=(len(ids), *ROW)).astype(np.float32)
    return ids, grads


class Reference:
    """The table as it should be: a row per id touched, its optimizer state, float64."""

    def __init__(self, held: HeldTable) -> None:
        self.held = held
        self.rows: Dict[int, np.ndarray] = {}
        self.state: Dict[int, list] = {}

    def row(self, i: int) -> np.ndarray:
        if i not in self.rows:
            self.rows[i] = initial_rows(self.held, np.array([i]), 6)[0].astype(np.float64)
            self.state[i] = [np.full(6, self.held.initial_accumulator), np.zeros(6), np.zeros(6), 0]
        return self.rows[i]

    def step(self, grads: Dict[int, np.ndarray]) -> None:
        h = self.held
        for i, g in grads.items():
            w, state = self.row(i), self.state[i]
            if h.optimizer == "sgd":
                w -= h.lr * g
            elif h.optimizer == "adagrad":
                state[0] += g * g
                w -= h.lr * g / (np.sqrt(state[0]) + h.eps)
            else:
                b1, b2 = h.betas
                state[3] += 1
                state[1] = b1 * state[1] + (1 - b1) * g
                state[2] = b2 * state[2] + (1 - b2) * g * g
                m_hat, v_hat = state[1] / (1 - b1 ** state[3]), state[2] / (1 - b2 ** state[3])
                w -= h.lr * m_hat / (np.sqrt(v_hat) + h.eps)


def train(rounds: int, optimizer: str) -> None:
    me, n = bps.rank(), bps.size()
    held, reference = HELD[optimizer], Reference(HELD[optimizer])
    for round_ in range(rounds):
        ids, grads = batch(me, round_)
        rows = worker().table_lookup_async(ids, "emb.held", NUM_ROWS, ROW, held).wait(WAIT_S).rows
        want = np.array([reference.row(i) for i in ids.tolist()]).reshape((len(ids), *ROW))
        assert rows.dtype == np.float32 and rows.shape == (len(ids), *ROW), (rows.dtype, rows.shape)
        np.testing.assert_allclose(rows, want, rtol=2e-5, atol=2e-6, err_msg=f"rank {me} round {round_}")
        worker().table_update_async(ids, grads, "emb.held", NUM_ROWS, ROW, held).wait(WAIT_S)
        summed: Dict[int, np.ndarray] = {}
        for rank in range(n):
            their_ids, their_grads = batch(rank, round_)
            for i, g in zip(their_ids.tolist(), their_grads.reshape(len(their_ids), 6).astype(np.float64)):
                summed[i] = summed.get(i, 0.0) + g
        reference.step({i: g / n for i, g in summed.items()})
    print(f"HELD OK rank {me}", flush=True)


def save_or_resume(mode: str, directory: str, rounds: int, at: int) -> None:
    me = bps.rank()
    held = HELD["adam"]
    if mode == "resume":
        if me == 0:
            worker().table_load(directory, "emb.held", NUM_ROWS, ROW, held)
        bps.barrier()
    for round_ in range(at if mode == "resume" else 0, rounds):
        if mode == "save" and round_ == at:
            bps.barrier()  # every rank's earlier rounds answered, hence applied
            if me == 0:
                worker().table_save(directory, "emb.held", NUM_ROWS, ROW, held)
            bps.barrier()
        ids, grads = batch(me, round_)
        worker().table_lookup(ids, "emb.held", NUM_ROWS, ROW, held)
        worker().table_update_async(ids, grads, "emb.held", NUM_ROWS, ROW, held).wait(WAIT_S)
    bps.barrier()
    if me == 0:
        touched = np.unique(np.concatenate([batch(rank, r)[0] for rank in range(bps.size()) for r in range(rounds)]))
        rows = worker().table_lookup(touched, "emb.held", NUM_ROWS, ROW, held)
        print("FINAL " + json.dumps(rows.reshape(-1).tolist()), flush=True)
    print(f"HELD OK rank {me}", flush=True)


def asynchronous(rounds: int, staleness: int) -> None:
    me, n = bps.rank(), bps.size()
    held = HELD["sgd"]
    markers = np.arange(NUM_ROWS - n, NUM_ROWS)  # rank k steps row NUM_ROWS - n + k by 1 every round
    start = initial_rows(held, markers, 6).reshape(n, 6)[:, 0].astype(np.float64)
    lag = 0

    def rows_of(rank: int, round_: int) -> Tuple[np.ndarray, np.ndarray]:  # the batch, without the markers
        ids, grads = batch(rank, round_)
        return ids[ids < markers[0]], grads[ids < markers[0]]

    for round_ in range(rounds):
        if me == n - 1:
            time.sleep(0.03)  # the straggler
        ids, grads = rows_of(me, round_)
        worker().table_lookup(ids, "emb.async", NUM_ROWS, ROW, held)
        ids = np.concatenate([ids, markers[me:me + 1]])
        grads = np.concatenate([grads, np.ones((1, *ROW), np.float32)])
        worker().table_update_async(ids, grads, "emb.async", NUM_ROWS, ROW, held).wait(WAIT_S)
        seen = worker().table_lookup(markers, "emb.async", NUM_ROWS, ROW, held).reshape(n, 6)[:, 0]
        applied = np.rint((start - seen) / held.lr).astype(int)  # each rank's pushes applied so far
        assert applied[me] == round_ + 1, (me, round_, applied)
        lag = max(lag, round_ + 1 - int(applied.min()))
        if staleness >= 0:
            assert round_ + 1 - applied.min() <= staleness, f"rank {me} round {round_}: pushes applied {applied}"
    bps.barrier()  # every rank's pushes answered, hence applied
    touched = np.unique(np.concatenate([rows_of(rank, r)[0] for rank in range(n) for r in range(rounds)]))
    want = {i: initial_rows(held, np.array([i]), 6)[0].astype(np.float64) for i in touched.tolist()}
    for rank in range(n):
        for r in range(rounds):
            their_ids, their_grads = rows_of(rank, r)
            for i, g in zip(their_ids.tolist(), their_grads.reshape(len(their_ids), 6).astype(np.float64)):
                want[i] -= held.lr * g  # each push once, every worker's own step: nothing averaged
    rows = worker().table_lookup(touched, "emb.async", NUM_ROWS, ROW, held).reshape(len(touched), 6)
    np.testing.assert_allclose(rows, np.array([want[i] for i in touched.tolist()]), rtol=1e-4, atol=1e-4,
                               err_msg=f"rank {me}")
    print(f"ASYNC OK rank {me} lag {lag}", flush=True)


def bad(case: str) -> None:
    me = bps.rank()
    held = HELD["sgd"]
    if case == "out_of_range":  # a lookup fails on its rank alone, at the call
        if me == 0:
            try:
                worker().table_lookup(np.array([3, NUM_ROWS]), "emb.held", NUM_ROWS, ROW, held)
            except ValueError as exc:
                assert f"[0, {NUM_ROWS})" in str(exc), exc
            else:
                raise AssertionError("an id out of range was looked up")
    elif case == "disagree":  # ranks declare the table with different optimizers: every rank fails
        mine = held if me == 0 else HELD["adagrad"]
        try:
            worker().table_update_async(np.array([1]), np.ones((1, *ROW), np.float32), "emb.held", NUM_ROWS, ROW,
                                        mine).wait(WAIT_S)
        except PushPullError as exc:
            assert "mismatch" in str(exc) or "failed" in str(exc), exc
        else:
            raise AssertionError(f"rank {me}: ranks disagreeing on the table's optimizer went unnoticed")
        held = None
    elif case == "held_then_not":  # a table keeps how it is held, refused at the call
        worker().table_lookup(np.array([1]), "emb.held", NUM_ROWS, ROW, held)
        try:
            worker().sparse_push_pull(np.array([1]), np.ones((1, *ROW), np.float32), "emb.held", NUM_ROWS, ROW)
        except (ValueError, PushPullError) as exc:
            assert "held" in str(exc), exc
        else:
            raise AssertionError("a held table was pushed as a plain row-sparse one")
    name = "emb.next"
    held = held or HELD["sgd"]
    rows = worker().table_lookup(np.array([4, 4, 2]), name, NUM_ROWS, ROW, held)
    np.testing.assert_allclose(rows[0], rows[1])
    np.testing.assert_allclose(rows[2], initial_rows(held, np.array([2]), 6)[0].reshape(ROW))
    worker().table_update_async(np.array([2]), np.ones((1, *ROW), np.float32), name, NUM_ROWS, ROW,
                                held).wait(WAIT_S)
    after = worker().table_lookup(np.array([2]), name, NUM_ROWS, ROW, held)
    np.testing.assert_allclose(after[0], rows[2] - held.lr, rtol=1e-5)
    print(f"BAD OK rank {me}", flush=True)


def main() -> None:
    bps.init()
    try:
        if sys.argv[1] == "train":
            train(int(sys.argv[2]), sys.argv[3])
        elif sys.argv[1] == "async":
            asynchronous(int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else -1)
        elif sys.argv[1] in ("save", "resume"):
            save_or_resume(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        else:
            bad(sys.argv[2])
    finally:
        bps.shutdown()


if __name__ == "__main__":
    main()
