"""Worker script: ``op=Adasum`` in the gradient wrappers, against numpy's Adasum of every rank's values.

Run under bpslaunch with 2 ranks (Keras 3, or Keras 2 with TF_USE_LEGACY_KERAS=1). Every rank knows
every rank's data (seeded by rank) and computes what it expects with
``byteps.common.frontend.adasum.adasum_tree``:

* DistributedGradientTape(op=Adasum): dense gradients eagerly and in
  ``tf.function``, float16 compression, IndexedSlices (refused without
  ``sparse_as_dense``, combined dense with it), and the refusals
  (predivide factor, compression_params);
* the Keras DistributedOptimizer(op=Adasum): ``apply_gradients`` eagerly
  and in ``tf.function``, and ``model.fit`` of a linear model over three
  steps against a numpy loop that combines the ranks' gradients by Adasum;
* the TF1 DistributedOptimizer(op=Adasum), Horovod's delta optimizer: each
  rank steps locally, and every ``backward_passes_per_step``-th step the
  changes are combined by Adasum, eagerly, in ``tf.function`` and in a
  TF1 graph.

Prints ``OK <check>`` per check and ``ALL OK <n>``.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from check_runner import Checks, assert_close, expect_error

import byteps.tensorflow as bps
from byteps.common.frontend.adasum import adasum_tree
from byteps.tensorflow.which_keras import KERAS2, keras

checks = Checks()


def x_of(rank: int) -> np.ndarray:
    """Rank ``rank``'s gradient of ``sum(w * x)``: neither parallel nor orthogonal to the other rank's."""
    return (np.array([1.0, -2.0, 0.5, 3.0]) * (rank + 1) + np.array([0.0, 1.0, 2.0, 0.0]) * rank).astype(np.float32)


def every_rank(of) -> list:
    return [of(k) for k in range(bps.size())]


def tape_gradient(variable: tf.Variable, x: tf.Tensor, **options) -> tf.Tensor:
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(variable * x)
    return bps.DistributedGradientTape(tape, op=bps.Adasum, **options).gradient(loss, [variable])[0]


def tape_dense():
    r = bps.rank()
    want = adasum_tree(every_rank(x_of))
    assert not np.allclose(want, np.mean(every_rank(x_of), axis=0)), "the check needs Adasum to differ from the mean"
    w = tf.Variable(tf.ones([4]))
    x = tf.constant(x_of(r))
    assert_close(tape_gradient(w, x), want, "tape Adasum, eager")
    in_graph = tf.function(lambda t: tape_gradient(w, t))
    assert_close(in_graph(x), want, "tape Adasum, tf.function")
    assert_close(in_graph(x), want, "tape Adasum, tf.function again")
    # Two sources, one of them a matrix: each gradient is combined alone (Horovod's per-tensor Adasum).
    m = tf.Variable(tf.ones([2, 3]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * x) + tf.reduce_sum(m * m) * float(r + 1)
    gw, gm = bps.DistributedGradientTape(tape, op=bps.Adasum).gradient(loss, [w, m])
    assert_close(gw, want, "tape Adasum, first of two sources")
    assert_close(gm, adasum_tree([np.full([2, 3], 2.0 * (k + 1), np.float32) for k in range(bps.size())]),
                 "tape Adasum, a matrix (parallel gradients: Adasum averages them)")
    # float16 on the wire: each rank's gradient rounded to float16, combined in float32, rounded again.
    halves = [x.astype(np.float16).astype(np.float32) for x in every_rank(x_of)]
    want16 = adasum_tree(halves).astype(np.float16).astype(np.float32)
    assert_close(tape_gradient(w, x, compression=bps.Compression.fp16), want16, "tape Adasum, fp16 compression")


def tape_sparse_and_refusals():
    r = bps.rank()
    table = tf.Variable(tf.ones([5, 2]))

    def lookup_gradient(**options):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(table, [r, 4]) * float(r + 1))
        return bps.DistributedGradientTape(tape, op=bps.Adasum, **options).gradient(loss, [table])[0]

    expect_error(NotImplementedError, "sparse_as_dense=True", lookup_gradient)

    def dense_of(rank: int) -> np.ndarray:
        dense = np.zeros([5, 2], np.float32)
        dense[[rank, 4]] += rank + 1
        return dense

    assert_close(lookup_gradient(sparse_as_dense=True), adasum_tree(every_rank(dense_of)),
                 "tape Adasum of IndexedSlices with sparse_as_dense=True")
    expect_error(ValueError, "gradient_predivide_factor", lambda: bps.DistributedGradientTape(
        tf.GradientTape(), op=bps.Adasum, gradient_predivide_factor=2.0))
    expect_error(ValueError, "drop compression_params", lambda: bps.DistributedGradientTape(
        tf.GradientTape(), op=bps.Adasum, compression_params={"compressor": "topk", "k": 1}))
    expect_error(ValueError, "average_aggregated_gradients", lambda: bps.DistributedOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(0.1), op=bps.Adasum, backward_passes_per_step=2,
        average_aggregated_gradients=True))


def keras_apply_gradients():
    r = bps.rank()
    want = 1.0 - 0.5 * adasum_tree(every_rank(x_of))
    for how in ("eager", "tf.function"):
        w = tf.Variable(tf.ones([4]))
        opt = bps.DistributedOptimizer(keras.optimizers.SGD(0.5), op=bps.Adasum, name=f"adasum.keras.{how}")

        def step(gradient, opt=opt, w=w):
            opt.apply_gradients([(gradient, w)])

        (step if how == "eager" else tf.function(step))(tf.constant(x_of(r)))
        assert_close(w, want, f"Keras DistributedOptimizer(op=Adasum).apply_gradients, {how}")


def data_of(rank: int):
    rng = np.random.default_rng(100 + rank)
    x = rng.normal(size=(8, 3)).astype(np.float32)
    y = (x @ np.array([[1.0, -1.0], [0.5, 2.0], [-1.5, 0.0]], np.float32) + rank).astype(np.float32)
    return x, y


def keras_fit():
    """model.fit of a Dense(2) under MSE, one batch per step, against numpy: gradients combined by Adasum."""
    r, lr, epochs = bps.rank(), 0.1, 3
    x, y = data_of(r)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, kernel_initializer="ones",
                                                                    bias_initializer="zeros")])
    model.compile(optimizer=bps.DistributedOptimizer(keras.optimizers.SGD(lr), op=bps.Adasum, name="adasum.fit"),
                  loss="mse")
    model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0)
    kernel, bias = np.ones((3, 2), np.float64), np.zeros(2, np.float64)
    for _ in range(epochs):
        kernels, biases = [], []
        for k in range(bps.size()):
            xk, yk = (a.astype(np.float64) for a in data_of(k))
            upstream = 2.0 * (xk @ kernel + bias - yk) / yk.size  # d(mean squared error)/d(prediction)
            kernels.append(xk.T @ upstream)
            biases.append(upstream.sum(axis=0))
        kernel = kernel - lr * adasum_tree(kernels)
        bias = bias - lr * adasum_tree(biases)
    dense = model.layers[-1]
    assert_close(dense.kernel, kernel, "Keras model.fit with op=Adasum: kernel", rtol=1e-4, atol=1e-5)
    assert_close(dense.bias, bias, "Keras model.fit with op=Adasum: bias", rtol=1e-4, atol=1e-5)


def delta_reference(passes: int, steps: int, lr: float):
    """Each rank steps on 0.5 |w - t_r|^2 with SGD; every ``passes``-th step the changes are combined."""
    targets = [x_of(k).astype(np.float64) for k in range(bps.size())]
    start = np.ones(4)
    weights = [start.copy() for _ in targets]
    history = []
    for k in range(steps):
        weights = [w - lr * (w - t) for w, t in zip(weights, targets)]
        if (k + 1) % passes == 0:
            start = start + adasum_tree([w - start for w in weights])
            weights = [start.copy() for _ in targets]
        history.append(weights[bps.rank()].copy())
    return history


def tf1_delta_optimizer():
    r, lr, steps = bps.rank(), 0.25, 4
    target = tf.constant(x_of(r))
    for passes in (1, 2):
        want = delta_reference(passes, steps, lr)
        for how in ("eager", "tf.function"):
            w = tf.Variable(tf.ones([4]))
            opt = bps.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(lr), op=bps.Adasum,
                                           backward_passes_per_step=passes, name=f"delta.{passes}.{how}")
            pairs = opt.compute_gradients(lambda w=w: 0.5 * tf.reduce_sum((w - target) ** 2), var_list=[w])
            assert_close(pairs[0][0], 1.0 - x_of(r), "compute_gradients: this rank's own gradient")

            def step(opt=opt, w=w):
                opt.minimize(lambda: 0.5 * tf.reduce_sum((w - target) ** 2), var_list=[w])

            run = step if how == "eager" else tf.function(step)
            for k in range(steps):
                run()
                assert_close(w, want[k], f"TF1 delta optimizer (passes={passes}), {how}, step {k + 1}", rtol=1e-5)
    want = delta_reference(2, steps, lr)
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([4]))
        global_step = tf.compat.v1.train.get_or_create_global_step()
        opt = bps.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(lr), op=bps.Adasum,
                                       backward_passes_per_step=2, name="delta.graph")
        train = opt.minimize(0.5 * tf.reduce_sum((w - x_of(r)) ** 2), var_list=[w], global_step=global_step)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for k in range(steps):
                session.run(train)
                assert_close(session.run(w), want[k], f"TF1 delta optimizer in a TF1 graph, step {k + 1}", rtol=1e-5)
                assert session.run(global_step) == k + 1


def main():
    tf.config.threading.set_intra_op_parallelism_threads(1)
    bps.init()
    assert bps.size() == 2, bps.size()
    print(f"KERAS {'2' if KERAS2 else '3'}", flush=True)
    checks.run("DistributedGradientTape(op=Adasum), dense", tape_dense)
    checks.run("DistributedGradientTape(op=Adasum), IndexedSlices and refusals", tape_sparse_and_refusals)
    checks.run("Keras DistributedOptimizer(op=Adasum).apply_gradients", keras_apply_gradients)
    checks.run("Keras model.fit with op=Adasum", keras_fit)
    checks.run("TF1 DistributedOptimizer(op=Adasum): the delta optimizer", tf1_delta_optimizer)
    bps.shutdown()
    checks.done()


if __name__ == "__main__":
    main()
