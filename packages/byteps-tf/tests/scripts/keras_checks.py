"""Worker script: byteps.keras (DistributedOptimizer, callbacks, load_model) in real model.fit runs.

Run under bpslaunch (2 ranks). The equivalence checks train a small Keras
model (embedding, hidden layer, output) for 10 updates three ways and
compare with the single-process run on whole batches that each rank
computes itself, within float32 tolerance:

* DistributedOptimizer on half batches (the embedding's gradient is an
  IndexedSlices: through a row-sparse push_pull with servers, one process a
  machine, as this script runs; gathered from both ranks elsewhere);
* the same with sparse_as_dense=True;
* backward_passes_per_step=2 on quarter batches (average_aggregated_gradients).

Local layers (Horovod's PartialDistributedOptimizer/GradientTape and the
broadcast callback's local_variables) are checked against plain gradients.

Ranks start from different random weights on purpose: the
BroadcastGlobalVariablesCallback must give them rank 0's.
"""

from __future__ import annotations

import os

import keras
import numpy as np
import tensorflow as tf
from check_runner import Checks, assert_close, assert_equal, expect_error

import byteps.keras as bps
import byteps.tensorflow
import byteps.tensorflow.keras

UPDATES, BATCH, VOCAB = 10, 16, 24
checks = Checks()


def make_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((3,), dtype="int32"),
        keras.layers.Embedding(VOCAB, 4),
        keras.layers.Flatten(),
        keras.layers.Dense(8, activation="tanh"),
        keras.layers.Dense(3),
    ])


def batches(count: int, size: int, seed: int = 7):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, VOCAB, size=(count * size, 3)).astype("int32")
    y = rng.integers(0, 3, size=(count * size,)).astype("int32")
    return x, y


def my_share(x: np.ndarray, y: np.ndarray, full: int, parts: int):
    """Rank r's slice of every full batch, in order: parts consecutive sub-batches per full batch per rank."""
    per_rank = full // bps.size()
    keep = np.concatenate([np.arange(s * full + bps.rank() * per_rank, s * full + (bps.rank() + 1) * per_rank)
                           for s in range(len(x) // full)])
    return x[keep], y[keep], per_rank // parts


def compile_model(model: keras.Model, optimizer: keras.optimizers.Optimizer) -> None:
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def reference_weights():
    x, y = batches(UPDATES, BATCH)
    model = make_model(100)
    compile_model(model, keras.optimizers.SGD(0.1, momentum=0.9))
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return x, y, [w.copy() for w in model.get_weights()]


def equivalence(expected, **options):
    x, y, want = expected
    passes = options.get("backward_passes_per_step", 1)
    xs, ys, batch = my_share(x, y, BATCH, passes)
    model = make_model(100 + bps.rank())
    compile_model(model, bps.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), **options))
    model.fit(xs, ys, batch_size=batch, epochs=1, shuffle=False, verbose=0,
              callbacks=[bps.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert int(model.optimizer.iterations.numpy()) == UPDATES, int(model.optimizer.iterations.numpy())
    worst = 0.0
    for got, ref, variable in zip(model.get_weights(), want, model.weights):
        assert_close(got, ref, f"{options}: {variable.path}")
        worst = max(worst, float(np.max(np.abs(got - ref))))
    print(f"equivalence {options}: largest difference from the single-process reference {worst:.2e}", flush=True)


class Recorder(keras.callbacks.Callback):
    """Copies the epoch logs and, per batch, the learning rate and SGD's momentum buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.epoch_logs, self.lrs, self.momentums = [], [], []

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append(dict(logs or {}))

    def on_train_batch_begin(self, batch, logs=None):
        optimizer = self.model.optimizer
        self.lrs.append(float(keras.ops.convert_to_numpy(optimizer.learning_rate)))
        self.momentums.append([keras.ops.convert_to_numpy(m).copy() for m in optimizer.momentums])


def fit_with_callbacks():
    r, n = bps.rank(), bps.size()
    x, y = batches(8, 8, seed=11 + r)   # different data per rank: metrics differ before averaging
    model = make_model(200 + r)
    compile_model(model, bps.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)))
    before, after, lr_before, lr_after = Recorder(), Recorder(), Recorder(), Recorder()
    warmup = bps.callbacks.LearningRateWarmupCallback(initial_lr=0.2, warmup_epochs=2, verbose=1)
    schedule = bps.callbacks.LearningRateScheduleCallback(initial_lr=0.2, multiplier=lambda e: 0.5 ** (e - 1),
                                                          start_epoch=2)
    model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0,
              callbacks=[bps.callbacks.BroadcastGlobalVariablesCallback(0), before,
                         bps.callbacks.MetricAverageCallback(), after, lr_before, warmup, schedule, lr_after])
    # every rank ends with the same weights
    for i, w in enumerate(model.get_weights()):
        assert_equal(byteps.tensorflow.broadcast(w, 0, name=f"final.{i}"), w, f"weights equal across ranks ({i})")
    # averaged metrics: the mean of the ranks' own values, the same on every rank
    local = np.array([logs["loss"] for logs in before.epoch_logs])
    mean = bps.allreduce(local, name="local.losses").numpy()
    averaged = np.array([logs["loss"] for logs in after.epoch_logs])
    assert_close(averaged, mean, "MetricAverageCallback")
    assert_equal(bps.broadcast(averaged, 0, name="averaged.losses"), averaged, "averaged metrics on every rank")
    # learning rates: warmup from 0.2 / n to 0.2 over 2 epochs of 8 steps, then 0.2 * 0.5 ** (epoch - 1)
    steps = 8
    want = [0.2 / n * ((e + (b + 1) / steps) * (n - 1) / 2 + 1) for e in range(2) for b in range(steps)]
    want += [0.1] * steps
    assert_close(np.array(lr_after.lrs), np.array(want), "learning rates of warmup and schedule", rtol=1e-6)
    assert lr_after.epoch_logs[-1]["lr"] == lr_after.lrs[-1], lr_after.epoch_logs[-1]
    # momentum correction: when the rate changes, SGD's momentum buffers scale by new / old
    for step in range(1, len(lr_before.lrs)):
        ratio = lr_after.lrs[step] / lr_before.lrs[step]
        for old, new in zip(lr_before.momentums[step], lr_after.momentums[step]):
            assert_close(new, old * ratio, f"momentum correction at step {step}")


def load_model():
    r = bps.rank()
    path = os.path.join(os.environ["BYTEPS_TEST_TMP"], "model.keras")
    x, y = batches(2, 8)
    model = make_model(300)
    compile_model(model, bps.DistributedOptimizer(keras.optimizers.Adam(0.01)))
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    if r == 0:
        model.save(path)
        assert type(keras.models.load_model(path).optimizer) is keras.optimizers.Adam  # loads plainly too
    bps.barrier()
    loaded = bps.load_model(path, compression=bps.Compression.fp16)
    assert isinstance(loaded.optimizer, keras.optimizers.Adam) and type(loaded.optimizer) is not keras.optimizers.Adam
    assert int(loaded.optimizer.iterations.numpy()) == 2
    mine = batches(2, 8, seed=20 + r)
    loaded.fit(*mine, batch_size=8, epochs=1, verbose=0)
    for i, w in enumerate(loaded.get_weights()):
        assert_equal(byteps.tensorflow.broadcast(w, 0, name=f"loaded.{i}"), w, f"loaded model in step ({i})")


def keras_api():
    r, n = bps.rank(), bps.size()
    assert bps.DistributedOptimizer is byteps.tensorflow.keras.DistributedOptimizer
    assert bps.callbacks.MetricAverageCallback is byteps.tensorflow.keras.callbacks.MetricAverageCallback
    assert_equal(bps.allreduce(np.float32(r + 1), op=bps.Sum), tf.constant(n * (n + 1) / 2, tf.float32), "allreduce")
    assert_equal(bps.push_pull([float(r)], name="k.pp"), tf.constant([(n - 1) / 2], tf.float32), "push_pull")
    assert_equal(bps.broadcast(np.int64(r + 5), 1, name="k.bc"), tf.constant(6, tf.int64), "broadcast")
    assert_equal(bps.allgather(np.full([r + 1, 2], r, "int32"), name="k.ag"),
                 tf.constant([[k, k] for k in range(n) for _ in range(k + 1)], tf.int32), "allgather of uneven rows")
    expect_error(RuntimeError, "TF1 graph", lambda: bps.broadcast_global_variables(0))
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build([keras.Variable(np.zeros(2, "float32"))])
    expect_error(ValueError, "already built", lambda: bps.DistributedOptimizer(optimizer))
    wrapped = byteps.tensorflow.DistributedOptimizer(keras.optimizers.RMSprop(0.1), backward_passes_per_step=3)
    assert isinstance(wrapped, keras.optimizers.RMSprop) and wrapped._byteps_passes == 3
    expect_error(ValueError, "already a DistributedOptimizer", lambda: bps.DistributedOptimizer(wrapped))


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


def custom_loop_in_function():
    """Keras optimizer + DistributedGradientTape in a tf.function, with a broadcast on the first step."""
    r = bps.rank()
    model = make_model(400 + r)
    optimizer = keras.optimizers.SGD(0.1)
    x, y = batches(1, 8, seed=30 + r)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model(x[:1])
    optimizer.build(model.trainable_variables)
    byteps.tensorflow.broadcast_variables(model.variables, root_rank=0)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = byteps.tensorflow.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for _ in range(3):
        step(x, y)
    for i, w in enumerate(model.get_weights()):
        assert_equal(byteps.tensorflow.broadcast(w, 0, name=f"loop.{i}"), w, f"custom loop keeps ranks equal ({i})")


def local_layers():
    """Horovod's local layers: their gradients stay on each rank (divided by size() unless told not to),
    the others are averaged; the broadcast callback leaves local variables alone."""
    r, n = bps.rank(), bps.size()
    upstream = float(r + 1)
    mean = (n + 1) / 2

    def fresh():
        shared = keras.layers.Dense(2, kernel_initializer="ones", bias_initializer="zeros")
        mine = keras.layers.Dense(2, kernel_initializer="ones", bias_initializer="zeros")
        model = keras.Sequential([keras.Input((2,)), shared, mine])
        return model, shared, mine

    x = tf.ones([1, 2])
    for scale in (True, False):
        model, shared, mine = fresh()
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x)) * upstream
        plain = dict(zip([v.path for v in model.trainable_variables],
                         tape.gradient(loss, model.trainable_variables)))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x)) * upstream
        tape = byteps.tensorflow.PartialDistributedGradientTape(tape, local_layers=mine,
                                                                scale_local_gradients=scale)
        grads = tape.gradient(loss, model.trainable_variables)
        for v, g in zip(model.trainable_variables, grads):
            local = any(v is w for w in mine.trainable_weights)
            want = plain[v.path] / (n if scale else 1) if local else plain[v.path] / upstream * mean
            assert_close(g, want, f"tape, {'local' if local else 'shared'} {v.path} (scale {scale})")
    # the Keras optimizer: SGD(1) on the same gradients moves shared weights alike on every rank
    model, shared, mine = fresh()
    optimizer = bps.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), local_layers=[mine])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x)) * upstream
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    for i, w in enumerate(shared.get_weights()):
        assert_equal(byteps.tensorflow.broadcast(w, 0, name=f"local.shared.{i}"), w, "shared layer equal on ranks")
    kernel = mine.get_weights()[0]
    assert_close(kernel, np.ones([2, 2]) - upstream * 2.0 / n, "local layer: own gradient / size")
    expect_error(ValueError, "Keras layers", lambda: bps.PartialDistributedOptimizer(keras.optimizers.SGD(1.0),
                                                                                      local_layers=["dense"]))
    # the callback broadcasts rank 0's shared weights and leaves the local ones
    mine.kernel.assign(tf.fill([2, 2], upstream))
    shared.kernel.assign(tf.fill([2, 2], upstream))
    callback = bps.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=mine.trainable_weights)
    callback.set_model(model)
    callback.on_train_begin()
    assert_equal(shared.kernel, tf.fill([2, 2], 1.0), "callback: shared kernel is rank 0's")
    assert_equal(mine.kernel, tf.fill([2, 2], upstream), "callback: local kernel is this rank's")


def main():
    tf.config.threading.set_intra_op_parallelism_threads(1)
    bps.init()
    expected = reference_weights()
    checks.run("equivalence: DistributedOptimizer on half batches (IndexedSlices)",
               lambda: equivalence(expected))
    checks.run("equivalence: sparse_as_dense", lambda: equivalence(expected, sparse_as_dense=True))
    checks.run("equivalence: backward_passes_per_step=2 on quarter batches",
               lambda: equivalence(expected, backward_passes_per_step=2, average_aggregated_gradients=True))
    checks.run("model.fit with the callbacks", fit_with_callbacks)
    checks.run("load_model", load_model)
    checks.run("keras API", keras_api)
    checks.run("DistributedOptimizer with Compression.fp16 and bf16, against a reference", compressed_updates)
    checks.run("custom loop in tf.function", custom_loop_in_function)
    checks.run("local layers: PartialDistributedOptimizer, PartialDistributedGradientTape, callback",
               local_layers)
    bps.shutdown()
    checks.done()


if __name__ == "__main__":
    main()
