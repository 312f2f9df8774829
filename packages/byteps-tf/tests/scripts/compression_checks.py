"""Worker script: a few SGD steps of a linear model with ``compression_params``, recorded per rank and case.

Usage: compression_checks.py OUT_DIR STEPS CASES_JSON (under bpslaunch, 2 workers, BYTEPS_MIN_COMPRESS_BYTES=64);
CASES_JSON maps each case's name to [compression_params, the optimizer's momentum], and the name's start
(see :data:`RUNS`) says how it trains.

Every case trains a Dense layer on 40 inputs (5 outputs; 4 for the
tape in tf.function, whose gradients would otherwise share the eager
tape's names): the kernel (800 bytes) is compressed, the bias (20 bytes)
goes as it is. Each step saves the local
gradients (what this rank computed), the gradients the compressed round
gave (what the optimizer applied) and the learning rate that went with
the push (it decays, so error feedback rescales), to
``OUT_DIR/<case>.rank<r>.npz``; test_compression.py replays the local
gradients through byteps.testkit.compression_reference and compares.

Ways to train: Keras ``DistributedOptimizer`` through ``model.fit``
(a learning-rate schedule, in tf.function), ``DistributedGradientTape``
eagerly and inside ``tf.function``, and the TF1 ``DistributedOptimizer``
over a ``MomentumOptimizer`` (eager).
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial
from typing import Dict, List

import keras
import numpy as np
import tensorflow as tf
from check_runner import Checks

import byteps.tensorflow as bps

FEATURES, OUTPUTS, BATCH = 40, 5, 8
out_dir, steps, CASES = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
checks = Checks()
bps.init()


def batches(case: str, outputs: int = OUTPUTS) -> List[tuple]:
    rng = np.random.default_rng([100 + bps.rank(), len(case)])
    return [(rng.normal(size=(BATCH, FEATURES)).astype("float32"), rng.normal(size=(BATCH, outputs)).astype("float32"))
            for _ in range(steps)]


def schedule() -> keras.optimizers.schedules.LearningRateSchedule:
    return keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.8)


def loss_of(output: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    return tf.reduce_mean((output - y) ** 2)


def save(case: str, record: Dict[str, list]) -> None:
    np.savez(os.path.join(out_dir, f"{case}.rank{bps.rank()}.npz"), **{k: np.array(v) for k, v in record.items()})


def new_record() -> Dict[str, list]:
    return {"local_kernel": [], "local_bias": [], "synced_kernel": [], "synced_bias": [], "lr": []}


def add(record: Dict[str, list], local: List[tf.Tensor], synced: List[tf.Tensor], lr: float) -> None:
    for key, value in zip(("local_kernel", "local_bias", "synced_kernel", "synced_bias"), (*local, *synced)):
        record[key].append(np.array(value))
    record["lr"].append(float(lr))


def dense_model(outputs: int) -> keras.Model:
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(outputs)])


class RecordingSGD(keras.optimizers.SGD):
    """SGD that keeps the gradients it applies (after byteps' reduction) and the learning rate it applies them with."""

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        for slot, grad in zip(RECORDED["synced"], grads):
            slot.assign(grad)
        RECORDED["lr"].assign(tf.cast(self.learning_rate, tf.float64))
        return super().apply(grads, trainable_variables)


class RecordingModel(keras.Model):
    """Dense(5) whose train step keeps its local gradients: Keras' own train step, recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = keras.layers.Dense(OUTPUTS)

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = loss_of(self(x, training=True), y)
        grads = tape.gradient(loss, self.trainable_variables)
        for slot, grad in zip(RECORDED["local"], grads):
            slot.assign(grad)
        self.optimizer.apply(grads, self.trainable_variables)
        return {"loss": loss}


RECORDED = {kind: [tf.Variable(tf.zeros([FEATURES, OUTPUTS])), tf.Variable(tf.zeros([OUTPUTS]))]
            for kind in ("local", "synced")}
RECORDED["lr"] = tf.Variable(0.0, dtype=tf.float64)


def keras_fit(case: str) -> None:
    params, mu = CASES[case]
    keras.utils.set_random_seed(3)
    model = RecordingModel()
    model.build((None, FEATURES))
    optimizer = bps.DistributedOptimizer(RecordingSGD(schedule(), momentum=mu), name=case,
                                         compression_params=params)
    assert optimizer.momentum == 0.0 and isinstance(optimizer, RecordingSGD), optimizer.get_config()
    model.compile(optimizer=optimizer, jit_compile=False)
    record = new_record()

    class Keep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            add(record, RECORDED["local"], RECORDED["synced"], RECORDED["lr"].numpy())

    data = batches(case)
    x, y = np.concatenate([b[0] for b in data]), np.concatenate([b[1] for b in data])
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[Keep()])
    assert len(record["lr"]) == steps and not optimizer.momentums, (len(record["lr"]), optimizer.momentums)
    save(case, record)


def tape_eager(case: str) -> None:
    params, _ = CASES[case]
    model = dense_model(OUTPUTS)
    optimizer = keras.optimizers.SGD(0.1)
    record = new_record()
    for x, y in batches(case):
        with tf.GradientTape(persistent=True) as tape:
            loss = loss_of(model(x), y)
        local = tape.gradient(loss, model.trainable_variables)
        distributed = bps.DistributedGradientTape(tape, optimizer=optimizer, compression_params=params)
        synced = distributed.gradient(loss, model.trainable_variables)
        add(record, local, synced, float(optimizer.learning_rate))
        optimizer.apply_gradients(zip(synced, model.trainable_variables))
        optimizer.learning_rate = float(optimizer.learning_rate) * 0.8
    save(case, record)


def tape_function(case: str) -> None:
    params, mu = CASES[case]
    # Another shape than tape_eager's: both tapes name their gradients "DistributedGradientTape.<i>", and a
    # name keeps its compression_params for the job (servers compare them); another shape is another tensor.
    model = dense_model(OUTPUTS - 1)
    optimizer = keras.optimizers.SGD(schedule(), momentum=mu)

    @tf.function(jit_compile=False)
    def step(x, y):
        with tf.GradientTape(persistent=True) as tape:
            loss = loss_of(model(x), y)
        local = tape.gradient(loss, model.trainable_variables)
        synced = bps.DistributedGradientTape(tape, optimizer=optimizer, compression_params=params).gradient(
            loss, model.trainable_variables)
        lr = tf.identity(optimizer.learning_rate)
        optimizer.apply_gradients(zip(synced, model.trainable_variables))
        return local, synced, lr

    record = new_record()
    for x, y in batches(case, OUTPUTS - 1):
        local, synced, lr = step(tf.constant(x), tf.constant(y))
        add(record, local, synced, lr.numpy())
    assert optimizer.momentum == 0.0 and not optimizer.momentums
    save(case, record)


def tf1_momentum(case: str) -> None:
    params, mu = CASES[case]
    rng = np.random.default_rng(3)
    kernel = tf.Variable(rng.normal(size=(FEATURES, OUTPUTS)).astype("float32") * 0.1)
    bias = tf.Variable(tf.zeros([OUTPUTS]))
    lr = [0.1]
    optimizer = bps.DistributedOptimizer(tf.compat.v1.train.MomentumOptimizer(lambda: lr[0], momentum=mu),
                                         name=case, compression_params=params)
    assert optimizer._optimizer._momentum == 0.0
    record = new_record()
    for x, y in batches(case):
        loss_fn = partial(lambda x, y: loss_of(tf.matmul(x, kernel) + bias, y), x, y)
        with tf.GradientTape() as tape:
            loss = loss_fn()
        local = tape.gradient(loss, [kernel, bias])
        pairs = optimizer.compute_gradients(loss_fn, var_list=[kernel, bias])
        add(record, local, [g for g, _ in pairs], lr[0])
        optimizer.apply_gradients(pairs)
        lr[0] *= 0.8
    save(case, record)


def small_gradients_fuse() -> None:
    """Fusion with compression_params: two compressed kernels share a bucket, each compressed alone (onebit: one
    scale per kernel); the gradients too small to compress share another, as plain averages."""
    from byteps.common import api
    from byteps.common.fusion import BUCKET_PREFIX

    rng = np.random.default_rng(bps.rank())
    kernel, kernel2, bias, gain = (tf.Variable(rng.normal(size=shape).astype("float32"))
                                   for shape in ((FEATURES, 3), (FEATURES, 3), (3,), (3,)))
    x = tf.constant(rng.normal(size=(BATCH, FEATURES)).astype("float32"))
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_sum((tf.matmul(x, kernel) + bias) * gain + 3.0 * tf.matmul(x, kernel2))
    local = tape.gradient(loss, [bias, gain])
    before = {name for name in api.worker().registry.tensor_ids if name.startswith(BUCKET_PREFIX)}
    synced = bps.DistributedGradientTape(tape, compression_params={"compressor": "onebit", "scaling": True}).gradient(
        loss, [kernel, kernel2, bias, gain])
    buckets = {name for name in api.worker().registry.tensor_ids if name.startswith(BUCKET_PREFIX)} - before
    assert len(buckets) == 2, buckets
    scales = [np.unique(np.abs(g.numpy())) for g in synced[:2]]
    assert [len(s) for s in scales] == [1, 1] and scales[0][0] != scales[1][0], scales  # a scale per kernel
    for index, (mine, averaged) in enumerate(zip(local, synced[2:])):
        expected = bps.allreduce(mine, op=bps.Average, name=f"fusion.check.{index}")
        np.testing.assert_allclose(averaged.numpy(), expected.numpy(), rtol=1e-6)


#: How a case trains, by the start of its name.
RUNS = {"keras-fit": keras_fit, "tape-eager": tape_eager, "tape-function": tape_function, "tf1-momentum": tf1_momentum}
for name in CASES:
    run = next(body for prefix, body in RUNS.items() if name.startswith(prefix))
    checks.run(name, partial(run, name))
checks.run("compressed and small gradients fuse apart", small_gradients_fuse)
checks.done()
bps.shutdown()
