"""Worker script of test_server_embedding.py: a ServerEmbedding trained beside a dense layer, on every rank
against a single-process numpy reference that trains the same table and dense layer on every rank's batches.

The reference's table starts from the same rows (``initial_rows`` of every id), its gradients are averaged
over the ranks as the servers do, and it steps with SGD or Adagrad (torch's formulas, which the servers
apply per row; a row without a gradient does not move under either). Checks, each printing ``OK <name>``:
``sgd``, ``adagrad`` (eager training through DistributedGradientTape; after every step, every rank's lookup
of the step's rows and the dense layer against the reference; at the end every touched row, rows never
trained, and ``training=False`` calls), ``sgd_in_function`` (the same step inside ``tf.function``),
``keras_fit`` (a Keras model of the layer trained by ``fit`` with byteps' Keras DistributedOptimizer, Adagrad
on the servers), ``eval_on_one_rank`` (rank 0 alone looks rows up with ``training=False``, eagerly and in
``tf.function``; nothing waits for the others), ``save_and_load`` (into the directory given as the first
argument; then a step through a ``tf.function`` forward under a tape outside it), ``bad_ids``. A forward in
training mode that no backward reaches (step 2) must push nothing.
"""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf
from check_runner import Checks, assert_close, expect_error

import byteps.tensorflow as bps
from byteps.common.held_table import HeldTable, initial_rows
from byteps.tensorflow.which_keras import keras

ROWS, DIM, FIELDS, BATCH, STEPS, DENSE_LR = 3000, 8, 5, 16, 6, 0.05
checks = Checks()


def batch(rank: int, step: int):
    rng = np.random.default_rng(1000 * rank + step)
    ids = (rng.zipf(1.5, size=(BATCH, FIELDS)) - 1) % ROWS  # power-law ids: many repeats within a batch
    return ids.astype(np.int64), rng.normal(size=BATCH).astype(np.float32)


def initial_dense():
    rng = np.random.default_rng(5)
    return (rng.normal(size=(DIM, 1)) * 0.3).astype(np.float32), np.full(1, 0.1, np.float32)


def model_loss(embed, dense, ids, y):
    return tf.reduce_mean((tf.squeeze(dense(tf.reduce_sum(embed(ids), 1)), 1) - y) ** 2)


class Reference:
    """The table and the dense layer trained in one process on every rank's batches (numpy, float64)."""

    def __init__(self, held: HeldTable, optimizer: str, lr: float, initial_accumulator: float) -> None:
        self.table = initial_rows(held, np.arange(ROWS), DIM).astype(np.float64)
        self.kernel, self.bias = (w.astype(np.float64) for w in initial_dense())
        self.optimizer, self.lr, self.eps = optimizer, lr, held.eps
        self.state = np.full_like(self.table, initial_accumulator)

    def step(self, step: int, n: int) -> None:
        g_table, g_kernel, g_bias = np.zeros_like(self.table), np.zeros_like(self.kernel), np.zeros_like(self.bias)
        for rank in range(n):
            ids, y = batch(rank, step)
            summed = self.table[ids].sum(1)                                # (BATCH, DIM)
            d_out = 2 * (summed @ self.kernel[:, 0] + self.bias[0] - y) / BATCH
            np.add.at(g_table, ids, np.broadcast_to(d_out[:, None, None] * self.kernel[None, None, :, 0],
                                                    (*ids.shape, DIM)))
            g_kernel[:, 0] += summed.T @ d_out
            g_bias[0] += d_out.sum()
        g_table, g_kernel, g_bias = g_table / n, g_kernel / n, g_bias / n
        self.kernel, self.bias = self.kernel - DENSE_LR * g_kernel, self.bias - DENSE_LR * g_bias
        if self.optimizer == "sgd":
            self.table -= self.lr * g_table
        else:  # Adagrad: sum += g²; w -= lr·g/(√sum + eps)
            self.state += g_table ** 2
            self.table -= self.lr * g_table / (np.sqrt(self.state) + self.eps)


def train(optimizer: str, kwargs: dict, function: bool = False) -> None:
    r, n = bps.rank(), bps.size()
    name = f"emb.{optimizer}" + (".function" if function else "")
    emb = bps.ServerEmbedding(ROWS, DIM, name=name, optimizer=optimizer, seed=7, init_std=0.1, **kwargs)
    assert not emb.trainable_variables, emb.trainable_variables
    dense = keras.layers.Dense(1, name=f"{name}.dense")
    dense.build((None, DIM))
    for variable, value in zip(dense.weights, initial_dense()):
        variable.assign(value)
    dense_opt = keras.optimizers.SGD(DENSE_LR)
    reference = Reference(HeldTable(optimizer=optimizer, seed=7, init_std=0.1, **kwargs), optimizer,
                          kwargs["lr"], kwargs.get("initial_accumulator", 0.0))

    def train_step(ids, y):
        with tf.GradientTape() as tape:
            loss = model_loss(emb, dense, ids, y)
        tape = bps.DistributedGradientTape(tape)
        grads = tape.gradient(loss, dense.trainable_variables)
        dense_opt.apply_gradients(zip(grads, dense.trainable_variables))
        return loss

    step_fn = tf.function(train_step) if function else train_step
    for step in range(STEPS):
        ids, y = batch(r, step)
        if step == 2:  # forwards in training mode that no backward reaches (a loss only printed): no round
            model_loss(emb, dense, tf.constant(ids), y).numpy()
            with tf.GradientTape():
                model_loss(emb, dense, tf.constant(ids), y).numpy()
        step_fn(tf.constant(ids if step % 2 else ids.astype(np.int32)), tf.constant(y))
        reference.step(step, n)
        for got, want, what in zip(dense.weights, (reference.kernel, reference.bias), ("kernel", "bias")):
            assert_close(got.numpy(), want, f"{name} step {step}: the dense {what}", rtol=1e-4, atol=1e-5)
        touched = np.unique(np.concatenate([batch(rank, step)[0].reshape(-1) for rank in range(n)]))
        assert_close(emb.lookup(tf.constant(touched)).numpy(), reference.table[touched],
                     f"{name} step {step}: the rows of the step", rtol=1e-4, atol=1e-5)
    touched = np.unique(np.concatenate([batch(rank, step)[0].reshape(-1) for rank in range(n)
                                        for step in range(STEPS)]))
    got = emb.lookup(tf.constant(touched)).numpy()
    assert_close(got, reference.table[touched], f"{name}: the table's rows", rtol=1e-4, atol=1e-5)
    start = initial_rows(emb.held, touched, DIM)
    assert np.abs(got - start).max() > 1e-3, f"{name}: training left the rows as they started"
    seen = set(touched.tolist())
    untouched = np.array([i for i in range(ROWS - 100, ROWS) if i not in seen][:5], np.int64)
    assert len(untouched) == 5, "the batches touched nearly every row"
    assert_close(emb.lookup(untouched).numpy(), reference.table[untouched], f"{name}: rows never trained")
    ids = batch(r, 0)[0]
    assert emb.lookup(ids).shape == (BATCH, FIELDS, DIM)
    assert_close(emb(ids, training=False), emb.lookup(ids), f"{name}: training=False is a lookup", 0, 0)


def keras_fit() -> None:
    """A Keras model (the layer, a sum, a dense layer) trained by ``fit`` with byteps' DistributedOptimizer."""
    import byteps.tensorflow.keras as kbps

    r, n = bps.rank(), bps.size()
    emb = kbps.ServerEmbedding(ROWS, DIM, name="emb.fit", optimizer="adagrad", lr=0.1, seed=7, init_std=0.1)
    dense = keras.layers.Dense(1)
    model = keras.Sequential([keras.Input((FIELDS,), dtype="int64"), emb,
                              keras.layers.Lambda(lambda rows: tf.reduce_sum(rows, 1)), dense])
    assert model.output_shape == (None, 1), model.output_shape
    for variable, value in zip(dense.weights, initial_dense()):
        variable.assign(value)
    model.compile(optimizer=kbps.DistributedOptimizer(keras.optimizers.SGD(DENSE_LR)), loss="mse")
    x, y = (np.concatenate(part) for part in zip(*(batch(r, step) for step in range(STEPS))))
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    reference = Reference(emb.held, "adagrad", 0.1, 0.0)
    for step in range(STEPS):
        reference.step(step, n)
    touched = np.unique(np.concatenate([batch(rank, step)[0].reshape(-1) for rank in range(n)
                                        for step in range(STEPS)]))
    assert_close(emb.lookup(touched).numpy(), reference.table[touched], "fit: the table's rows",
                 rtol=1e-4, atol=1e-5)
    for got, want, what in zip(dense.weights, (reference.kernel, reference.bias), ("kernel", "bias")):
        assert_close(got.numpy(), want, f"fit: the dense {what}", rtol=1e-4, atol=1e-5)
    predicted = model.predict(x[:BATCH], batch_size=BATCH, verbose=0)  # training=False: no round
    assert predicted.shape == (BATCH, 1)


def eval_on_one_rank() -> None:
    emb = bps.ServerEmbedding(ROWS, DIM, name="emb.sgd", optimizer="sgd", lr=0.2, seed=7, init_std=0.1)
    if bps.rank() == 0:
        with tf.GradientTape() as tape:  # a tape watching everything: training=False still pushes nothing
            out = emb(tf.constant([[1, 2], [2, 1]]), training=False)
            loss = tf.reduce_sum(out)
        assert not tape.watched_variables(), tape.watched_variables()
        tape.gradient(loss, [])  # a backward pass that would push, had the lookup been recorded
        emb.flush()
        assert out.shape == (2, 2, DIM) and np.array_equal(out[0, 0].numpy(), out[1, 1].numpy())
        looked_up = tf.function(lambda ids: emb(ids, training=False))(tf.constant([2, 1], tf.int64))
        assert_close(looked_up, tf.stack([out[0, 1], out[0, 0]]), "a lookup in tf.function", 0, 0)
    bps.barrier()


def save_and_load(directory: str) -> None:
    """The table saved, changed by a step, loaded: the saved rows again (on every rank)."""
    emb = bps.ServerEmbedding(ROWS, DIM, name="emb.sgd", optimizer="sgd", lr=0.2, seed=7, init_std=0.1)
    ids = tf.range(10, dtype=tf.int64)
    saved = emb.lookup(ids).numpy()
    emb.save(directory)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(emb(ids))
    tape.gradient(loss, [])  # no sources: the backward still reaches the rows, and pushes their gradient
    emb.flush()
    assert_close(emb.lookup(ids), saved - 0.2, "a step of SGD on a gradient of ones")
    emb.load(directory)
    assert_close(emb.lookup(ids), saved, "the rows loaded")
    forward = tf.function(lambda i: tf.reduce_sum(emb(i)))
    with tf.GradientTape() as tape:  # the tape outside the tf.function: its backward function pushes
        loss = forward(ids)
    tape.gradient(loss, [])
    emb.flush()
    assert_close(emb.lookup(ids), saved - 0.2, "a step of SGD through a tf.function's backward function")


def bad_ids() -> None:
    emb = bps.ServerEmbedding(ROWS, DIM, name="emb.sgd", optimizer="sgd", lr=0.2, seed=7, init_std=0.1)
    expect_error(ValueError, f"[0, {ROWS})", lambda: emb(tf.constant([0, ROWS])))
    expect_error(ValueError, "ServerEmbedding('emb.sgd'): ids must be an int64 or int32",
                 lambda: emb(tf.constant([0.0, 1.0])))
    expect_error(ValueError, "int64 or int32", lambda: emb.lookup(np.array([0.0])))
    expect_error(ValueError, "int64 or int32", lambda: tf.function(emb)(tf.constant([0.0, 1.0])))
    expect_error(ValueError, "first used with sgd", lambda: bps.ServerEmbedding(
        ROWS, DIM, name="emb.sgd", optimizer="adam", lr=0.2).lookup(tf.constant([1])))


def main() -> None:
    bps.init()
    checks.run("sgd", lambda: train("sgd", {"lr": 0.2}))
    checks.run("adagrad", lambda: train("adagrad", {"lr": 0.1, "initial_accumulator": 0.1}))
    checks.run("sgd_in_function", lambda: train("sgd", {"lr": 0.2}, function=True))
    checks.run("keras_fit", keras_fit)
    checks.run("eval_on_one_rank", eval_on_one_rank)
    checks.run("save_and_load", lambda: save_and_load(sys.argv[1]))
    checks.run("bad_ids", bad_ids)
    bps.shutdown()
    checks.done()


if __name__ == "__main__":
    main()
