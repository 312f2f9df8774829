"""Worker script of test_server_embedding.py: a ServerEmbedding trained beside a gluon Dense layer, on every rank
against a single-process numpy reference that trains a float64 table and dense layer on every rank's batches.

The reference's table starts from the same rows (``initial_rows`` of every id), takes each step's gradients of
every rank's batch (written out by hand), averages them over the ranks as the servers and DistributedTrainer do,
and applies SGD or Adagrad (``sum += g²; w -= lr·g/(√sum + eps)``) to the table and SGD to the dense layer.
Checks, each printing ``OK <name>``: ``sgd``, ``adagrad`` (training with the loss checked at every step, then every
rank's lookup of the rows touched, of rows never touched, and the dense layer against the reference),
``eval_on_one_rank`` (rank 0 alone looks rows up outside ``autograd.record()`` and under
``record(train_mode=False)``; nothing waits for the others), ``save_and_load`` (into the directory given as the
first argument), ``bad_ids`` (and the refusals: a float dtype, a HybridBlock parent, another optimizer).
"""

from __future__ import annotations

import sys

import mxnet as mx
import numpy as np
from check_runner import Checks, assert_array, expect_error
from mxnet import autograd, gluon

import byteps.mxnet as bps
from byteps.common.held_table import HeldTable, initial_rows

ROWS, DIM, FIELDS, BATCH, STEPS, DENSE_LR = 3000, 8, 5, 16, 6, 0.05
checks = Checks()


def batch(rank: int, step: int):
    """Rank ``rank``'s ids at ``step`` (power-law: many repeats within a batch, some shared by ranks), targets."""
    rng = np.random.default_rng(1000 * rank + step)
    ids = (rng.zipf(1.5, size=(BATCH, FIELDS)) - 1) % ROWS
    return ids.astype(np.int64), rng.normal(size=BATCH).astype(np.float32)


def model_loss(rows, dense, y):
    """The mean squared error of ``dense`` over each sample's rows summed (``rows``: the lookup's output)."""
    return ((dense(rows.sum(1)).reshape(-1) - mx.nd.array(y)) ** 2).mean()


class Reference:
    """The model in float64 numpy: table ``(ROWS, DIM)``, dense ``w (1, DIM)``, ``b (1,)``; one process."""

    def __init__(self, held: HeldTable, w: np.ndarray, b: np.ndarray) -> None:
        self.held, self.w, self.b = held, w.astype(np.float64), b.astype(np.float64)
        self.table = initial_rows(held, np.arange(ROWS), DIM).astype(np.float64)
        self.accumulator = np.full_like(self.table, held.initial_accumulator)

    def gradients(self, ids: np.ndarray, y: np.ndarray):
        """The loss and the gradients of the table (dense, zero off the batch), w and b on one batch."""
        summed = self.table[ids].sum(1)  # (BATCH, DIM)
        residual = summed @ self.w[0] + self.b[0] - y
        loss = float(np.mean(residual ** 2))
        d_out = 2.0 * residual / len(y)
        d_table = np.zeros_like(self.table)
        np.add.at(d_table, ids, np.broadcast_to((d_out[:, None] * self.w[0])[:, None, :], ids.shape + (DIM,)))
        return loss, d_table, (d_out @ summed)[None, :], np.array([d_out.sum()])

    def step(self, batches) -> list:
        """Every batch's gradients averaged, then one step; the losses per batch, before the step."""
        results = [self.gradients(ids, y) for ids, y in batches]
        d_table, d_w, d_b = (sum(r[k] for r in results) / len(results) for k in (1, 2, 3))
        if self.held.optimizer == "sgd":
            self.table -= self.held.lr * d_table
        else:  # adagrad; rows without a gradient are left as they are (their accumulator gains 0)
            self.accumulator += d_table ** 2
            self.table -= self.held.lr * d_table / (np.sqrt(self.accumulator) + self.held.eps)
        self.w -= DENSE_LR * d_w
        self.b -= DENSE_LR * d_b
        return [r[0] for r in results]


def train(optimizer: str, kwargs: dict, numpy_ids: bool) -> None:
    r, n = bps.rank(), bps.size()
    name = f"emb.{optimizer}"
    emb = bps.ServerEmbedding(ROWS, DIM, name=name, optimizer=optimizer, seed=7, init_std=0.1, **kwargs)
    assert not list(emb.collect_params().keys()), "a held table has no gluon Parameters"
    dense = gluon.nn.Dense(1, in_units=DIM, prefix=f"{optimizer}_dense_")
    mx.random.seed(0)
    dense.initialize(mx.init.Uniform(0.5))
    trainer = bps.DistributedTrainer(dense.collect_params(), "sgd", {"learning_rate": DENSE_LR, "wd": 0.0})
    ref = Reference(HeldTable(optimizer=optimizer, seed=7, init_std=0.1, **kwargs), dense.weight.data().asnumpy(),
                    dense.bias.data().asnumpy())
    for step in range(STEPS):
        ids, y = batch(r, step)
        ids = ids if numpy_ids else mx.nd.array(ids, dtype=np.int64)
        if step == 2:  # a forward in training mode that no backward reaches (a loss only printed): no round
            with autograd.record():
                model_loss(emb(ids), dense, y).asnumpy()
        with autograd.record():
            out = emb(ids)
            loss = model_loss(out, dense, y)
        assert out.shape == (BATCH, FIELDS, DIM), out.shape
        loss.backward()
        trainer.step(1)  # the loss is a mean already
        want = ref.step([batch(rank, step) for rank in range(n)])[r]
        np.testing.assert_allclose(loss.asscalar(), want, rtol=1e-4, atol=1e-5, err_msg=f"{optimizer}: step {step}")
    touched = np.unique(np.concatenate([batch(rank, step)[0].reshape(-1) for rank in range(n)
                                        for step in range(STEPS)]))
    assert_array(emb.lookup(touched), ref.table[touched].astype(np.float32), f"{optimizer}: the table's rows",
                 rtol=1e-4, atol=1e-5)
    untouched = np.array([i for i in range(ROWS - 100, ROWS) if i not in set(touched.tolist())][:5], dtype=np.int64)
    assert len(untouched) == 5, "the batches touched nearly every row"
    assert_array(emb.lookup(mx.nd.array(untouched, dtype=np.int32)), ref.table[untouched].astype(np.float32),
                 f"{optimizer}: rows never trained")
    assert_array(dense.weight.data(), ref.w.astype(np.float32), f"{optimizer}: the dense weight", rtol=1e-4,
                 atol=1e-5)
    assert_array(dense.bias.data(), ref.b.astype(np.float32), f"{optimizer}: the dense bias", rtol=1e-4, atol=1e-5)


def eval_on_one_rank() -> None:
    emb = bps.ServerEmbedding(ROWS, DIM, name="emb.sgd", optimizer="sgd", lr=0.2, seed=7, init_std=0.1)
    if bps.rank() == 0:
        ids = mx.nd.array([[1, 2], [2, 1]], dtype=np.int64)
        out = emb(ids)
        assert out.shape == (2, 2, DIM) and (out[0, 0] == out[1, 1]).min().asscalar() == 1
        with autograd.record(train_mode=False):
            predicted = emb(ids)
        emb.flush()
        assert_array(predicted, out.asnumpy(), "a lookup under record(train_mode=False)")
        assert_array(emb.lookup(ids), out.asnumpy(), "the rows after an evaluation")
    bps.barrier()


def save_and_load(directory: str) -> None:
    """The table saved, changed by a step, loaded: the saved rows again (on every rank)."""
    emb = bps.ServerEmbedding(ROWS, DIM, name="emb.sgd", optimizer="sgd", lr=0.2, seed=7, init_std=0.1)
    ids = mx.nd.arange(10, dtype=np.int64)
    saved = emb.lookup(ids).asnumpy()
    emb.save(directory)
    with autograd.record():
        total = emb(ids).sum()
    total.backward()  # returns before MXNet's engine runs the table's backward: the lookup waits for it
    changed = emb.lookup(ids).asnumpy()
    np.testing.assert_allclose(changed, saved - 0.2, rtol=1e-5, err_msg="one SGD step of gradient 1")
    emb.load(directory)
    assert_array(emb.lookup(ids), saved, "the rows loaded")


def bad_ids() -> None:
    emb = bps.ServerEmbedding(ROWS, DIM, name="emb.sgd", optimizer="sgd", lr=0.2, seed=7, init_std=0.1)
    expect_error(ValueError, f"[0, {ROWS})", lambda: emb(mx.nd.array([0, ROWS], dtype=np.int64)))
    expect_error(ValueError, "ServerEmbedding('emb.sgd'): ids must be an integer", lambda: emb(mx.nd.array([0, 1])))
    expect_error(ValueError, "not float64", lambda: emb.lookup(np.array([0.0, 1.0])))
    expect_error(ValueError, "not list", lambda: emb([0, 1]))
    expect_error(ValueError, "must also be HybridBlock", lambda: gluon.nn.HybridSequential().add(emb))
    expect_error(ValueError, "first used with sgd", lambda: bps.ServerEmbedding(
        ROWS, DIM, name="emb.sgd", optimizer="adam", lr=0.2).lookup(np.array([1])))


def main() -> None:
    bps.init()
    checks.run("sgd", lambda: train("sgd", {"lr": 0.2}, numpy_ids=False))
    checks.run("adagrad", lambda: train("adagrad", {"lr": 0.1, "initial_accumulator": 0.1}, numpy_ids=True))
    checks.run("eval_on_one_rank", eval_on_one_rank)
    checks.run("save_and_load", lambda: save_and_load(sys.argv[1]))
    checks.run("bad_ids", bad_ids)
    mx.nd.waitall()
    bps.shutdown()
    checks.done()


if __name__ == "__main__":
    main()
