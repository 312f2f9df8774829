"""Worker script: byteps.keras on Keras 2 (tf_keras, TF_USE_LEGACY_KERAS=1) in real model.fit runs.

Run under bpslaunch (2 ranks) with TF_USE_LEGACY_KERAS=1. Horovod scripts
written for Keras 2 run this way on a recent TensorFlow; what they touch
is checked against references each rank computes itself:

* DistributedOptimizer over both Keras 2 optimizer families (the current
  ``optimizers`` and the ``optimizers.legacy`` ones), 2 ranks on half
  batches against one process on whole batches, also with
  backward_passes_per_step=2 on quarter batches (``iterations`` counting
  every pass, as Horovod's does: the reference's is advanced to match);
* where the averaging happens: ``compute_gradients``/``_compute_gradients``
  (Horovod's place; ``apply_gradients`` then does not reduce again), or
  ``apply_gradients`` for gradients from the caller's own tape; the
  running sums and counter of N > 1 inside a ``tf.function``;
* the callbacks (broadcast from different starting weights, metric
  averaging, learning-rate warmup);
* SyncBatchNormalization as a Keras 2 layer against numpy on both ranks'
  batches; PartialDistributedGradientTape's local/global split;
* byteps.keras's own allreduce, allgather and broadcast; DistributedOptimizer
  with fp16 and bf16 compression against the average of the rounded gradients;
* the errors a Keras 2 script can run into.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf
import tf_keras as keras
from check_runner import Checks, assert_close, assert_equal, expect_error

import byteps.keras as bps
import byteps.tensorflow
from byteps.tensorflow.which_keras import KERAS2

UPDATES, BATCH, FEATURES, CLASSES = 6, 16, 4, 3
checks = Checks()

OPTIMIZERS = {
    "optimizers.SGD": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "optimizers.legacy.SGD": lambda: keras.optimizers.legacy.SGD(0.1, momentum=0.9),
    "optimizers.legacy.Adam": lambda: keras.optimizers.legacy.Adam(0.01),
}


def make_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.layers.Dense(8, activation="tanh", input_shape=(FEATURES,)),
                             keras.layers.Dense(CLASSES)])


def compile_model(model: keras.Model, optimizer) -> None:
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def batches(count: int, size: int, seed: int = 7):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(count * size, FEATURES)).astype("float32"),
            rng.integers(0, CLASSES, size=(count * size,)).astype("int32"))


def my_share(x: np.ndarray, y: np.ndarray, parts: int):
    """Rank r's slice of every full batch, in order, as ``parts`` sub-batches each."""
    per_rank = BATCH // bps.size()
    keep = np.concatenate([np.arange(s * BATCH + bps.rank() * per_rank, s * BATCH + (bps.rank() + 1) * per_rank)
                           for s in range(len(x) // BATCH)])
    return x[keep], y[keep], per_rank // parts


def keras_2_is_the_one():
    assert os.environ.get("TF_USE_LEGACY_KERAS") == "1" and KERAS2
    assert tf.keras.optimizers.SGD is keras.optimizers.SGD  # tf.keras is tf_keras here
    assert isinstance(byteps.tensorflow.SyncBatchNormalization(), keras.layers.BatchNormalization)
    assert issubclass(bps.callbacks.MetricAverageCallback, keras.callbacks.Callback)


def equivalence(kind: str, passes: int) -> None:
    x, y = batches(UPDATES, BATCH)
    reference = make_model(100)
    compile_model(reference, OPTIMIZERS[kind]())

    class CountPasses(keras.callbacks.Callback):
        """The distributed optimizer's ``iterations`` counts every backward pass (Horovod's rule), so each of
        its updates sees ``passes`` more than the last one: the reference's does too (Adam's bias correction)."""

        def on_train_batch_begin(self, batch, logs=None):
            reference.optimizer.iterations.assign_add(passes - 1)

    reference.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[CountPasses()])
    xs, ys, batch = my_share(x, y, passes)
    model = make_model(100 + bps.rank())   # different weights: the broadcast callback must give rank 0's
    optimizer = bps.DistributedOptimizer(OPTIMIZERS[kind](), backward_passes_per_step=passes,
                                         average_aggregated_gradients=True)
    assert isinstance(optimizer, type(OPTIMIZERS[kind]())) and optimizer.get_config() == OPTIMIZERS[kind]().get_config()
    compile_model(model, optimizer)
    model.fit(xs, ys, batch_size=batch, epochs=1, shuffle=False, verbose=0,
              callbacks=[bps.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert_equal(int(optimizer.iterations.numpy()), UPDATES * passes, "iterations: one per backward pass")
    if passes > 1:
        assert_equal(int(optimizer._agg_helper.counter.numpy()), 0, "no pass left in the sums")
    worst = 0.0
    for got, want, variable in zip(model.get_weights(), reference.get_weights(), model.weights):
        assert_close(got, want, f"{kind}, {passes} passes: {variable.name}")
        worst = max(worst, float(np.max(np.abs(got - want))))
    print(f"equivalence {kind} passes={passes}: largest difference from the single-process reference {worst:.2e}",
          flush=True)


def where_gradients_are_summed():
    r, n = bps.rank(), bps.size()
    everyone = n * (n + 1) / 2   # the sum over ranks of (rank + 1)
    v = tf.Variable([1.0, 2.0])
    optimizer = bps.DistributedOptimizer(keras.optimizers.SGD(1.0), op=bps.Sum)   # Sum: a second reduction shows
    pairs = optimizer.compute_gradients(lambda: (r + 1.0) * tf.reduce_sum(v), [v])
    assert_close(pairs[0][0], np.full(2, everyone, "float32"), "compute_gradients reduces, as Horovod's does")
    optimizer.apply_gradients(pairs)
    assert_close(v, np.array([1.0, 2.0], "float32") - everyone, "apply_gradients takes them without reducing again")
    with tf.GradientTape() as tape:
        loss = (r + 1.0) * tf.reduce_sum(v)
    optimizer.apply_gradients(zip(tape.gradient(loss, [v]), [v]))   # a custom loop: reduced here instead
    assert_close(v, np.array([1.0, 2.0], "float32") - 2 * everyone, "apply_gradients reduces its caller's gradients")

    w = tf.Variable([0.0])
    legacy = bps.DistributedOptimizer(keras.optimizers.legacy.SGD(1.0), backward_passes_per_step=2)

    @tf.function
    def step():
        grads_and_vars = legacy._compute_gradients(lambda: (r + 1.0) * tf.reduce_sum(w), var_list=[w])
        legacy.apply_gradients(grads_and_vars)
        return grads_and_vars[0][0]

    assert_close(step(), np.array([r + 1.0], "float32"), "pass 1 of 2: this rank's running sum")
    assert_equal((float(w.numpy()[0]), int(legacy.iterations.numpy()), int(legacy._agg_helper.counter.numpy())),
                 (0.0, 1, 1), "pass 1 of 2: nothing applied, iterations and counter at 1")
    assert_close(step(), np.array([n + 1.0], "float32"), "pass 2 of 2: the sums averaged over the ranks")
    assert_equal((float(w.numpy()[0]), int(legacy.iterations.numpy()), int(legacy._agg_helper.counter.numpy())),
                 (-(n + 1.0), 2, 0), "pass 2 of 2: applied once, iterations 2, counter back at 0")

    # compute_gradients eagerly, apply_gradients in a tf.function: whether they are averaged cannot be told there
    apart = bps.DistributedOptimizer(keras.optimizers.SGD(1.0))
    pairs = apart.compute_gradients(lambda: (r + 1.0) * tf.reduce_sum(v), [v])
    expect_error(ValueError, "same tf.function", lambda: tf.function(apart.apply_gradients)(pairs))

    # a LossScaleOptimizer around it applies inside a tf.cond of model.fit's graph: accepted, the ranks agree
    x, y = batches(2, 8, seed=3 + r)
    model = make_model(300)
    compile_model(model, keras.mixed_precision.LossScaleOptimizer(bps.DistributedOptimizer(keras.optimizers.SGD(0.1))))
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    for i, weight in enumerate(model.get_weights()):
        assert_equal(byteps.tensorflow.broadcast(weight, 0, name=f"k2.lso.{i}"), weight,
                     f"LossScaleOptimizer: weights equal across ranks ({i})")


def callbacks():
    r = bps.rank()
    x, y = batches(4, 8, seed=11 + r)   # different data per rank: the metrics differ before averaging
    model = make_model(200 + r)
    compile_model(model, bps.DistributedOptimizer(keras.optimizers.legacy.SGD(0.05)))

    class Losses(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.losses = []

        def on_epoch_end(self, epoch, logs=None):
            self.losses.append(logs["loss"])

    before, after = Losses(), Losses()
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[
        bps.callbacks.BroadcastGlobalVariablesCallback(0), before, bps.callbacks.MetricAverageCallback(), after,
        bps.callbacks.LearningRateWarmupCallback(initial_lr=0.2, warmup_epochs=1)])
    mean = bps.allreduce(np.array(before.losses), name="k2.losses").numpy()
    assert_close(np.array(after.losses), mean, "MetricAverageCallback")
    assert_close(np.array(history.history["lr"]), np.array([0.2, 0.2]), "learning rate after the warmup", rtol=1e-6)
    for i, w in enumerate(model.get_weights()):
        assert_equal(byteps.tensorflow.broadcast(w, 0, name=f"k2.final.{i}"), w, f"weights equal across ranks ({i})")


def sync_batch_norm():
    r, n = bps.rank(), bps.size()
    rng = np.random.default_rng(5)
    everyone = [rng.normal(loc=3.0 * k, size=(4 + k, 3)).astype("float32") for k in range(n)]
    layer = byteps.tensorflow.SyncBatchNormalization(momentum=0.5, epsilon=1e-3)
    out = layer(tf.constant(everyone[r]), training=True)
    whole = np.concatenate(everyone)
    mean, variance = whole.mean(0), whole.var(0)
    assert_close(out, (everyone[r] - mean) / np.sqrt(variance + 1e-3), "normalized with both ranks' statistics",
                 rtol=1e-4, atol=1e-4)
    assert_close(layer.moving_mean, 0.5 * mean, "moving mean from the global mean", rtol=1e-4, atol=1e-5)


def local_and_global_gradients():
    r, n = bps.rank(), bps.size()
    shared, mine = tf.Variable([1.0, 2.0]), tf.Variable([3.0])
    with tf.GradientTape() as tape:
        loss = (r + 1.0) * (tf.reduce_sum(shared) + tf.reduce_sum(mine))
    tape = byteps.tensorflow.PartialDistributedGradientTape(tape, local_layers=[])
    tape.register_local_source(mine)
    local, others = tape.get_local_and_global_gradients(loss, [shared, mine])
    assert [v is mine for v, _ in local] == [True] and [v is shared for v, _ in others] == [True]
    assert_close(local[0][1], np.array([(r + 1.0) / n], "float32"), "a local gradient is this rank's, divided by n")
    assert_close(others[0][1], np.full(2, (n + 1) / 2, "float32"), "a shared gradient is averaged")


def keras_api():
    """byteps.keras's own ops under Keras 2: thin wrappers of byteps.tensorflow's, on tensor-like values."""
    r, n = bps.rank(), bps.size()
    assert_equal(bps.allreduce(np.float32(r + 1), op=bps.Sum, name="k2.ar"), tf.constant(n * (n + 1) / 2,
                 tf.float32), "allreduce")
    assert_equal(bps.allgather(np.full([r + 1, 2], r, "int32"), name="k2.ag"),
                 tf.constant([[k, k] for k in range(n) for _ in range(k + 1)], tf.int32), "allgather of uneven rows")
    assert_equal(bps.broadcast(np.array([r + 5.0, -r], "float32"), 1, name="k2.bc"), tf.constant([6.0, -1.0]),
                 "broadcast from rank 1")
    assert_equal(bps.broadcast(tf.fill([2, 2], r), 0, name="k2.bc0"), tf.zeros([2, 2], tf.int32),
                 "broadcast from rank 0")

def compressed_updates():
    """DistributedOptimizer(compression=fp16 / bf16): each rank's gradient goes as a 16-bit float. 0.5, -3, 96
    are exact in both; 1 + 2**-12 is not (rank k sends k + 1 for its (k + 1) * (1 + 2**-12)), so the update
    is the average of the rounded gradients, not of the exact ones."""
    r, n = bps.rank(), bps.size()
    base = np.array([0.5, -3.0, 96.0, 1.0 + 2.0 ** -12], "float32")
    for compression, half in ((bps.Compression.fp16, tf.float16), (bps.Compression.bf16, tf.bfloat16)):
        sent = [tf.cast(tf.cast(base * (k + 1), half), tf.float64).numpy() for k in range(n)]
        want = (-sum(sent) / n).astype("float32")
        assert want[3] == -(n + 1) / 2, want   # the exact average would be (n + 1) / 2 * (1 + 2**-12)
        v = tf.Variable(np.zeros(4, "float32"))
        optimizer = bps.DistributedOptimizer(keras.optimizers.SGD(1.0), compression=compression)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v * base * (r + 1))
        optimizer.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
        assert_equal(v, want, f"SGD(1) update with {half.name} compression")


def errors():
    import keras as keras3

    expect_error(TypeError, "wraps a Keras 2 optimizer", lambda: bps.DistributedOptimizer(keras3.optimizers.SGD(0.1)))
    expect_error(ValueError, "need Keras 3", lambda: bps.DistributedOptimizer(
        keras.optimizers.SGD(0.1), compression_params={"compressor": "onebit"}))
    built = keras.optimizers.SGD(0.1)
    built.build([tf.Variable([1.0])])
    expect_error(ValueError, "already built", lambda: bps.DistributedOptimizer(built))
    legacy = keras.optimizers.legacy.SGD(0.1)
    legacy.apply_gradients([(tf.constant([1.0]), tf.Variable([1.0]))])
    expect_error(ValueError, "already built", lambda: bps.DistributedOptimizer(legacy))
    wrapped = byteps.tensorflow.DistributedOptimizer(keras.optimizers.legacy.RMSprop(0.1))  # the TF entry point
    assert isinstance(wrapped, keras.optimizers.legacy.RMSprop) and hasattr(wrapped, "_byteps_reducer")
    expect_error(ValueError, "already a DistributedOptimizer", lambda: bps.DistributedOptimizer(wrapped))


bps.init()
checks.run("Keras 2 is the Keras of tf.keras and of byteps", keras_2_is_the_one)
for kind in OPTIMIZERS:
    for passes in (1, 2):
        checks.run(f"{kind}, {passes} pass(es): 2 ranks on parts of batches = 1 process on whole batches",
                   lambda kind=kind, passes=passes: equivalence(kind, passes))
checks.run("compute_gradients reduces (Horovod's place), apply_gradients only what it was not given reduced",
           where_gradients_are_summed)
checks.run("callbacks: broadcast, metric average, learning-rate warmup", callbacks)
checks.run("SyncBatchNormalization (Keras 2) against numpy", sync_batch_norm)
checks.run("PartialDistributedGradientTape.get_local_and_global_gradients", local_and_global_gradients)
checks.run("the Keras API: allreduce, allgather, broadcast", keras_api)
checks.run("DistributedOptimizer with Compression.fp16 and bf16, against a reference", compressed_updates)
checks.run("errors", errors)
checks.done()
