"""Worker script (2 ranks, BYTEPS_ENABLE_ASYNC=1): what asynchronous training refuses, and eager TF1 and Keras.

* compression (``compression=`` or ``compression_params``) and a process
  set, on the Keras and TF1 DistributedOptimizer and on the tape: a
  ValueError naming BYTEPS_ENABLE_ASYNC;
* a DistributedGradientTape and a DistributedOptimizer exchanging the same
  variables (each update would count twice): a ValueError naming both; a
  tape whose source lists overlap: a ValueError;
* an eager TF1 optimizer, an eager Keras ``apply_gradients`` and Keras with
  ``backward_passes_per_step=2`` in a tf.function train asynchronously:
  after a barrier and a zero-delta exchange both ranks hold the same
  weights (the servers').
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
from check_runner import Checks, assert_close, expect_error

import byteps.tensorflow as bps
from byteps.tensorflow import async_training

checks = Checks()
FRAGMENT = "BYTEPS_ENABLE_ASYNC=1"


def same_on_every_rank(values, what: str) -> None:
    for i, value in enumerate(values):
        assert_close(bps.broadcast(tf.constant(value), 0, name=f"{what}.{i}"), value, f"{what} {i}", atol=0)


def refusals():
    tape = tf.GradientTape()
    process_set = bps.ProcessSet([0, 1])  # any set but the global one (registered or not)
    for what, call in [
        ("Keras compression", lambda: bps.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                                               compression=bps.Compression.fp16)),
        ("Keras compression_params", lambda: bps.DistributedOptimizer(
            keras.optimizers.SGD(0.1), compression_params={"compressor": "onebit", "ef": "vanilla"})),
        ("TF1 compression", lambda: bps.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1),
                                                             compression=bps.Compression.fp16)),
        ("tape compression", lambda: bps.DistributedGradientTape(tape, compression=bps.Compression.fp16)),
        ("tape compression_params", lambda: bps.DistributedGradientTape(
            tape, compression_params={"compressor": "topk", "k": 0.1})),
        ("Keras process set", lambda: bps.DistributedOptimizer(keras.optimizers.SGD(0.1), process_set=process_set)),
        ("tape process set", lambda: bps.DistributedGradientTape(tape, process_set=process_set)),
    ]:
        message = expect_error(ValueError, FRAGMENT, call)
        print(f"REFUSED {what}: {message}", flush=True)


def tape_and_optimizer_together():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    optimizer = bps.DistributedOptimizer(keras.optimizers.SGD(0.1))
    x, y = tf.ones((4, 3)), tf.zeros((4, 2))
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - y) ** 2)
    grads = bps.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
    expect_error(ValueError, "count its updates twice",
                 lambda: optimizer.apply_gradients(zip(grads, model.trainable_variables)))


def overlapping_tape_sources():
    a, b = tf.Variable([1.0, 2.0]), tf.Variable([3.0])

    def gradient(sources):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(a * a) + tf.reduce_sum(b)
        return bps.DistributedGradientTape(tape).gradient(loss, sources)

    for _ in range(2):  # the same list again is fine (local gradients, the first call broadcasts rank 0's a)
        assert_close(gradient([a, b])[0], [2.0, 4.0], "local gradient")
    expect_error(ValueError, "another list of variables", lambda: gradient([b]))  # a part of it is not


def tf1_eager():
    rng = np.random.default_rng(10 + bps.rank())  # different weights: the first exchange gives rank 0's
    w = tf.Variable(rng.standard_normal((3, 2)).astype("float32"))
    optimizer = bps.DistributedOptimizer(tf.compat.v1.train.MomentumOptimizer(0.1, 0.5))
    x = tf.constant(rng.standard_normal((8, 3)).astype("float32"))
    for _ in range(3 + bps.rank()):  # a different number of steps per rank: nobody waits
        optimizer.minimize(lambda: tf.reduce_sum((x @ w) ** 2), var_list=[w])
    bps.barrier()
    optimizer._exchanges.get([w]).around(lambda: None)  # a zero delta: the servers' weights
    same_on_every_rank([w.numpy()], "tf1")


def keras_eager():
    keras.utils.set_random_seed(20 + bps.rank())
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])
    optimizer = bps.DistributedOptimizer(keras.optimizers.Adam(0.01))
    x = tf.random.normal((8, 3), seed=bps.rank())
    for _ in range(2 + 2 * bps.rank()):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(x) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    bps.barrier()
    optimizer._byteps_exchange.around(lambda: None)
    same_on_every_rank(model.get_weights(), "keras")
    assert isinstance(optimizer._byteps_exchange, async_training.VariableExchange)


def keras_passes_in_function():
    """backward_passes_per_step=2 inside tf.function: every second pass applies the sums and exchanges."""
    keras.utils.set_random_seed(30 + bps.rank())
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    optimizer = bps.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2)
    x = tf.random.normal((8, 3), seed=bps.rank())

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(x) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    for _ in range(4 + 2 * bps.rank()):
        step()
    exchange = optimizer._byteps_exchange
    assert exchange.parameters.steps == 2 + bps.rank(), exchange.parameters.steps
    assert int(optimizer.iterations.numpy()) == 2 + bps.rank()
    bps.barrier()
    exchange.around(lambda: None)
    same_on_every_rank(model.get_weights(), "passes")


def main():
    tf.config.threading.set_intra_op_parallelism_threads(1)
    bps.init()
    checks.run("compression and process sets are refused", refusals)
    checks.run("a tape and an optimizer on the same variables are refused", tape_and_optimizer_together)
    checks.run("overlapping tape sources are refused", overlapping_tape_sources)
    checks.run("TF1 optimizer, eager", tf1_eager)
    checks.run("Keras optimizer, eager", keras_eager)
    checks.run("Keras optimizer, backward passes in tf.function", keras_passes_in_function)
    bps.shutdown()
    checks.done()


if __name__ == "__main__":
    main()
