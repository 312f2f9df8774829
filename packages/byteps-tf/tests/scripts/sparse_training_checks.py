"""Worker script: ``tf.IndexedSlices`` gradients (an embedding looked up by ids) trained through the gradient
wrappers, checked on every rank against a single-process reference, and which path they took.

Usage: python sparse_training_checks.py row-sparse|gather [graph]: the path the layout must take
(docs/sparse.md); ``graph``: eager execution disabled, the TF1 DistributedOptimizer in a
``tf.compat.v1.Session`` (Keras 3, or Keras 2 with TF_USE_LEGACY_KERAS=1 otherwise).

The model is a table of 1000 rows of 8 (an embedding looked up with
``tf.gather`` or a Keras ``Embedding``) and a dense layer of one output on
top, trained by SGD on a squared error. Every rank trains on its own batch
of 12 ids a step (duplicates within a rank, overlaps between ranks, and one
row of its own), regenerated from seeds, so every rank computes the job's
averaged gradient itself (in numpy, float64) and compares the weights after
every step. It also checks the path: with ``row-sparse`` the gradient is a
``tf.IndexedSlices`` over the union of every rank's ids (unique,
ascending), its table (the gradient's push_pull name and layout) took one
round a step, and the bytes sent per step stay far below the dense table;
with ``gather`` it holds every rank's ids and no table took a round.

Checks: the DistributedGradientTape with a Keras SGD eagerly, the tape
with ``op=Sum`` in ``tf.function``, the Keras DistributedOptimizer through
``train_on_batch``, the TF1 DistributedOptimizer eagerly (or, with
``graph``, in a Session), and bfloat16 and float16 tables' gradients.
Prints ``OK <check>`` per check and ``ALL OK <n>``.
"""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf

GRAPH = sys.argv[2:] == ["graph"]
if GRAPH:
    tf.compat.v1.disable_eager_execution()

from check_runner import Checks, assert_close  # noqa: E402

import byteps.tensorflow as bps  # noqa: E402
from byteps.common import api  # noqa: E402
from byteps.tensorflow.which_keras import keras  # noqa: E402

ROWS, DIM, STEPS, LR = 1000, 8, 5, 0.5
PATH = sys.argv[1]
checks = Checks()


def batch(rank: int, step: int):
    """Rank ``rank``'s ids and targets of ``step``: 11 ids of the first 60 rows and one far row of its own."""
    generator = np.random.RandomState(7919 * rank + step)
    ids = np.concatenate([generator.randint(0, 60, 11), [900 + rank]]).astype(np.int32)
    return ids, generator.randn(12).astype(np.float32)


def initial():
    """The table, the dense kernel (8, 1) and bias (1,) every check starts from."""
    generator = np.random.RandomState(3)
    return [(generator.randn(ROWS, DIM) * 0.1).astype(np.float32),
            (generator.randn(DIM, 1) * 0.1).astype(np.float32), np.zeros(1, np.float32)]


def reference():
    """The weights after each step of SGD on every rank's batches, the gradients averaged (numpy, float64)."""
    table, kernel, bias = (w.astype(np.float64) for w in initial())
    n, history = bps.size(), []
    for step in range(STEPS):
        grads = [np.zeros_like(table), np.zeros_like(kernel), np.zeros_like(bias)]
        for rank in range(n):
            ids, target = batch(rank, step)
            rows = table[ids]
            d_out = 2 * (rows @ kernel[:, 0] + bias[0] - target) / len(ids)   # d loss / d output
            np.add.at(grads[0], ids, d_out[:, None] * kernel[:, 0][None, :])
            grads[1][:, 0] += rows.T @ d_out
            grads[2][0] += d_out.sum()
        table, kernel, bias = (w - LR * g / n for w, g in zip((table, kernel, bias), grads))
        history.append((table, kernel, bias))
    return history


REFERENCE: list = []


def loss_of(table, kernel, bias, ids, target):
    output = tf.matmul(tf.gather(table, ids), kernel) + bias
    return tf.reduce_mean((tf.squeeze(output, 1) - target) ** 2)


class PathWatch:
    """The worker's row-sparse tables' rounds and bytes sent around a check: which path its gradients took."""

    def __init__(self) -> None:
        self.worker = api.worker()
        self.rounds = {name: table.rounds for name, table in self.worker.sparse.tables.items()}
        self.sent = self.worker.bytes_sent

    def check(self, what: str) -> None:
        used = {name: table.rounds - self.rounds.get(name, 0) for name, table in self.worker.sparse.tables.items()
                if table.rounds != self.rounds.get(name, 0)}
        if PATH == "row-sparse":
            assert list(used.values()) == [STEPS], f"{what}: rounds of row-sparse tables {used}"
            assert next(iter(used)).endswith(f"[{ROWS}x{DIM} float32]"), used
            per_step = (self.worker.bytes_sent - self.sent) / STEPS
            assert per_step < ROWS * DIM * 4 / 8, f"{what}: {per_step} bytes sent per step: the dense table went"
        else:
            assert not used, f"{what}: {PATH} layout, yet row-sparse tables were used: {used}"


def check_indices(indices, step: int, what: str) -> None:
    """The reduced gradient's ids: the union of every rank's, ascending (row-sparse), or all of them."""
    everyone = [batch(rank, step)[0] for rank in range(bps.size())]
    if PATH == "row-sparse":
        want = np.unique(np.concatenate(everyone))
    else:
        want = np.concatenate(everyone)
    assert np.asarray(indices).tolist() == want.tolist(), f"{what} step {step}: ids {indices}, expected {want}"


def check_weights(weights, step: int, what: str) -> None:
    for got, want, name in zip(weights, REFERENCE[step], ("table", "kernel", "bias")):
        assert_close(np.asarray(got), want, f"{what} step {step} {name}", rtol=1e-4, atol=1e-5)


def tape(function: bool) -> None:
    """DistributedGradientTape and a Keras SGD: eagerly with Average, in tf.function with Sum (and lr / n)."""
    variables = [tf.Variable(w) for w in initial()]
    op, lr = (bps.Sum, LR / bps.size()) if function else (bps.Average, LR)
    optimizer = keras.optimizers.SGD(lr)
    optimizer.build(variables)

    def train_step(ids, target):
        with tf.GradientTape() as recorded:
            loss = loss_of(*variables, ids, target)
        gradients = bps.DistributedGradientTape(recorded, op=op).gradient(loss, variables)
        assert isinstance(gradients[0], tf.IndexedSlices), type(gradients[0])
        optimizer.apply_gradients(zip(gradients, variables))
        return gradients[0].indices

    step_fn = tf.function(train_step) if function else train_step
    what = "tape in tf.function (Sum)" if function else "tape eagerly"
    watch = PathWatch()
    for step in range(STEPS):
        indices = step_fn(*batch(bps.rank(), step))
        check_indices(indices.numpy(), step, what)
        check_weights([v.numpy() for v in variables], step, what)
    watch.check(what)


def keras_optimizer() -> None:
    """The Keras DistributedOptimizer of a model with an Embedding layer, through train_on_batch."""
    model = keras.Sequential([keras.layers.Embedding(ROWS, DIM), keras.layers.Dense(1)])
    model.build((None,))
    model.set_weights(initial())
    model.compile(optimizer=bps.DistributedOptimizer(keras.optimizers.SGD(LR)), loss="mse", jit_compile=False)
    watch = PathWatch()
    for step in range(STEPS):
        ids, target = batch(bps.rank(), step)
        model.train_on_batch(ids, target.reshape(-1, 1))
        check_weights(model.get_weights(), step, "Keras DistributedOptimizer")
    watch.check("Keras DistributedOptimizer")


def tf1_optimizer_eagerly() -> None:
    variables = [tf.Variable(w) for w in initial()]
    optimizer = bps.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(LR))
    watch = PathWatch()
    for step in range(STEPS):
        ids, target = batch(bps.rank(), step)
        optimizer.minimize(lambda ids=ids, target=target: loss_of(*variables, ids, target), var_list=variables)
        check_weights([v.numpy() for v in variables], step, "TF1 DistributedOptimizer eagerly")
    watch.check("TF1 DistributedOptimizer eagerly")


def tf1_optimizer_in_a_session() -> None:
    v1 = tf.compat.v1
    variables = [tf.Variable(w) for w in initial()]
    ids, target = v1.placeholder(tf.int32, [None]), v1.placeholder(tf.float32, [None])
    optimizer = bps.DistributedOptimizer(v1.train.GradientDescentOptimizer(LR))
    gradients = optimizer.compute_gradients(loss_of(*variables, ids, target), var_list=variables)
    assert isinstance(gradients[0][0], tf.IndexedSlices), type(gradients[0][0])
    train = optimizer.apply_gradients(gradients)
    watch = PathWatch()
    with v1.Session() as session:
        session.run(v1.global_variables_initializer())
        for step in range(STEPS):
            mine, targets = batch(bps.rank(), step)
            indices, _ = session.run([gradients[0][0].indices, train], {ids: mine, target: targets})
            check_indices(indices, step, "TF1 DistributedOptimizer in a Session")
            check_weights(session.run(variables), step, "TF1 DistributedOptimizer in a Session")
    watch.check("TF1 DistributedOptimizer in a Session")


def half_slices(dtype: tf.DType) -> None:
    """A bfloat16 or float16 table's gradient through the tape: row-sparse in its 16-bit storage (or gathered),
    averaged as numpy does it in float64, within the dtype's precision."""
    table = tf.Variable(tf.cast(initial()[0], dtype))
    weights = np.linspace(-1, 1, DIM)
    before = {name: t.rounds for name, t in api.worker().sparse.tables.items()}
    with tf.GradientTape() as recorded:
        loss = tf.reduce_sum(tf.gather(table, batch(bps.rank(), 0)[0]) * tf.constant(weights, dtype))
    gradient = bps.DistributedGradientTape(recorded).gradient(loss, [table])[0]
    assert isinstance(gradient, tf.IndexedSlices) and gradient.values.dtype == dtype, gradient
    got, want = np.zeros((ROWS, DIM)), np.zeros((ROWS, DIM))
    np.add.at(got, gradient.indices.numpy(), gradient.values.numpy().astype(np.float64))
    for rank in range(bps.size()):
        np.add.at(want, batch(rank, 0)[0], weights[None, :])
    assert_close(got, want / bps.size(), f"{dtype.name} gradient", rtol=1e-2, atol=1e-2)
    used = [name for name, t in api.worker().sparse.tables.items() if t.rounds != before.get(name, 0)]
    assert len(used) == (PATH == "row-sparse") and all(name.endswith(f"{dtype.name}]") for name in used), used


def main() -> None:
    if not GRAPH:
        tf.config.threading.set_intra_op_parallelism_threads(1)
    bps.init()
    REFERENCE.extend(reference())
    if GRAPH:
        checks.run("TF1 DistributedOptimizer in a Session", tf1_optimizer_in_a_session)
    else:
        checks.run("DistributedGradientTape eagerly", lambda: tape(False))
        checks.run("DistributedGradientTape in tf.function, Sum", lambda: tape(True))
        checks.run("Keras DistributedOptimizer", keras_optimizer)
        checks.run("TF1 DistributedOptimizer eagerly", tf1_optimizer_eagerly)
        checks.run("bfloat16 slices through the tape", lambda: half_slices(tf.bfloat16))
        checks.run("float16 slices through the tape", lambda: half_slices(tf.float16))
    bps.shutdown()
    checks.done()


if __name__ == "__main__":
    main()
