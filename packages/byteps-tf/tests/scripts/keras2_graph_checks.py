"""Worker script: byteps.keras on Keras 2 in a TF1 graph (eager execution disabled), as old Keras scripts train.

Run under bpslaunch (2 ranks) with TF_USE_LEGACY_KERAS=1. Keras 2 then
trains through its graph loop, where the optimizer's ``get_gradients`` and
``apply_gradients`` build one graph and only what a fetched tensor depends
on runs. DistributedOptimizer with backward_passes_per_step=2 (averaged)
on quarter batches is checked against one process on whole batches, the
weights and ``iterations`` (one per backward pass, as Horovod counts).
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()

import tf_keras as keras  # noqa: E402
from check_runner import Checks, assert_close, assert_equal  # noqa: E402

import byteps.keras as bps  # noqa: E402

STEPS, BATCH, PASSES = 4, 8, 2
checks = Checks()


def model_with(optimizer) -> keras.Model:
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.layers.Dense(3, activation="tanh", input_shape=(4,)), keras.layers.Dense(2)])
    model.compile(optimizer=optimizer, loss="mse")
    return model


def graph_training_with_backward_passes():
    assert os.environ.get("TF_USE_LEGACY_KERAS") == "1" and not tf.executing_eagerly()
    rng = np.random.default_rng(9)
    x = rng.normal(size=(STEPS * BATCH, 4)).astype("float32")
    y = rng.normal(size=(STEPS * BATCH, 2)).astype("float32")
    reference = model_with(keras.optimizers.legacy.SGD(0.1, momentum=0.9))
    reference.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    # rank r's quarter of every batch, in order: PASSES sub-batches of BATCH / (size * PASSES) rows
    per_rank = BATCH // bps.size()
    keep = np.concatenate([np.arange(s * BATCH + bps.rank() * per_rank, s * BATCH + (bps.rank() + 1) * per_rank)
                           for s in range(STEPS)])
    optimizer = bps.DistributedOptimizer(keras.optimizers.legacy.SGD(0.1, momentum=0.9),
                                         backward_passes_per_step=PASSES, average_aggregated_gradients=True)
    model = model_with(optimizer)
    model.fit(x[keep], y[keep], batch_size=per_rank // PASSES, epochs=1, shuffle=False, verbose=0)
    value = keras.backend.get_value
    assert_equal(int(value(optimizer.iterations)), STEPS * PASSES, "iterations: one per backward pass")
    assert_equal(int(value(optimizer._agg_helper.counter)), 0, "no pass left in the sums")
    for got, want, variable in zip(model.get_weights(), reference.get_weights(), model.weights):
        assert_close(got, want, f"TF1 graph, {PASSES} passes: {variable.name}")


bps.init()
checks.run("Keras 2 in a TF1 graph, backward_passes_per_step=2: 2 ranks = 1 process",
           graph_training_with_backward_passes)
checks.done()
