"""Worker script: what a TF1 graph (eager execution disabled, ``tf.compat.v1.Session``) does beyond the collectives
of tf1_graph_checks.py, for tests/matrix/test_tf1_graph.py.

Usage: tf1_graph_matrix_checks.py OUT_DIR STEPS CASES_JSON, under bpslaunch with 2 workers and 1 server,
BYTEPS_MIN_COMPRESS_BYTES=64 and TF_USE_LEGACY_KERAS=1 (SyncBatchNormalization is then a Keras 2 layer, the only
Keras with a graph mode). Checks:

* ``compression_params`` with the TF1 ``DistributedOptimizer`` over a ``MomentumOptimizer`` whose learning rate
  is a placeholder (a decaying value fed every step): each case's local gradients, the gradients the compressed
  round gave (fetched in the same ``session.run`` as the update, so the applied ones) and the learning rates go
  to ``OUT_DIR/<case>.rank<r>.npz``, which the test replays through byteps.testkit.compression_reference;
* SyncBatchNormalization (Keras 2) in the graph, training: its output and its moving statistics against numpy
  on both ranks' batches together;
* ``broadcast_global_variables(root_rank)``: every global variable gets the root's value.

Prints ``OK <check>`` per check and ``ALL OK <n>``.
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()

from check_runner import Checks, assert_close, assert_equal  # noqa: E402

import byteps.tensorflow as bps  # noqa: E402

FEATURES, OUTPUTS, BATCH = 40, 5, 8
v1 = tf.compat.v1
checks = Checks()


def momentum_compression(case: str, params: dict, mu: float, steps: int, out_dir: str) -> None:
    rng = np.random.default_rng(3)
    kernel = v1.get_variable("kernel", initializer=(rng.normal(size=(FEATURES, OUTPUTS)) * 0.1).astype("float32"))
    bias = v1.get_variable("bias", initializer=np.zeros(OUTPUTS, np.float32))
    x = v1.placeholder(tf.float32, [BATCH, FEATURES])
    y = v1.placeholder(tf.float32, [BATCH, OUTPUTS])
    lr = v1.placeholder(tf.float32, [])
    loss = tf.reduce_mean((tf.matmul(x, kernel) + bias - y) ** 2)
    local = tf.gradients(loss, [kernel, bias])
    optimizer = bps.DistributedOptimizer(v1.train.MomentumOptimizer(lr, momentum=mu), name=case,
                                         compression_params=params)
    assert optimizer._optimizer._momentum == 0.0  # byteps applies the Nesterov momentum
    pairs = optimizer.compute_gradients(loss, var_list=[kernel, bias])
    train = optimizer.apply_gradients(pairs)
    synced = [g for g, _ in pairs]
    data = np.random.default_rng([100 + bps.rank(), len(case)])
    record = {"local_kernel": [], "local_bias": [], "synced_kernel": [], "synced_bias": [], "lr": []}
    rate = 0.1
    with v1.Session() as session:
        session.run(v1.global_variables_initializer())
        for _ in range(steps):
            feed = {x: data.normal(size=(BATCH, FEATURES)).astype("float32"),
                    y: data.normal(size=(BATCH, OUTPUTS)).astype("float32"), lr: rate}
            mine, got, _ = session.run([local, synced, train], feed)
            for key, value in zip(("local_kernel", "local_bias", "synced_kernel", "synced_bias"), (*mine, *got)):
                record[key].append(value)
            record["lr"].append(float(np.float32(rate)))
            rate *= 0.8
    np.savez(os.path.join(out_dir, f"{case}.rank{bps.rank()}.npz"), **{k: np.array(v) for k, v in record.items()})


def sync_batch_norm() -> None:
    """Keras 2's layer in a graph: statistics of both ranks' batches (of different sizes), moving ones too."""
    from byteps.tensorflow.which_keras import KERAS2

    assert KERAS2, "run with TF_USE_LEGACY_KERAS=1"
    n, r = bps.size(), bps.rank()
    batches = [np.random.default_rng(7 + k).normal(2.0, 3.0, size=(3 + k, 4)).astype("float32") for k in range(n)]
    layer = bps.SyncBatchNormalization(momentum=0.5, epsilon=1e-3)
    x = v1.placeholder(tf.float32, [None, 4])
    out = layer(x, training=True)
    updates = layer.updates
    assert updates, "Keras 2 in a graph keeps the moving statistics' assigns in layer.updates"
    with v1.Session() as session:
        session.run(v1.global_variables_initializer())
        got, _ = session.run([out, updates], {x: batches[r]})
        moving_mean, moving_variance = session.run([layer.moving_mean, layer.moving_variance])
    whole = np.concatenate(batches).astype(np.float64)
    mean, variance = whole.mean(axis=0), whole.var(axis=0)
    assert_close(got, ((batches[r] - mean) / np.sqrt(variance + 1e-3)).astype(np.float32), "normalized output",
                 rtol=1e-4, atol=1e-5)
    assert_close(moving_mean, (0.5 * mean).astype(np.float32), "moving mean", rtol=1e-5)
    assert_close(moving_variance, (0.5 + 0.5 * variance).astype(np.float32), "moving variance", rtol=1e-5)


def broadcast_global_variables() -> None:
    n, r = bps.size(), bps.rank()
    weights = v1.get_variable("weights", initializer=tf.fill([2, 3], float(r + 1)))
    steps = v1.get_variable("steps", initializer=tf.constant(10 * r, tf.int64), trainable=False)
    flags = v1.get_variable("flags", initializer=tf.constant([r == 0, r == 1]))
    with v1.Session() as session:
        session.run(v1.global_variables_initializer())
        session.run(bps.broadcast_global_variables(n - 1))
        got = session.run([weights, steps, flags])
    assert_equal(got[0], np.full((2, 3), float(n), np.float32), "float variable from the last rank")
    assert_equal(got[1], np.int64(10 * (n - 1)), "int64 variable from the last rank")
    assert_equal(got[2], np.array([n - 1 == 0, n - 1 == 1]), "bool variable from the last rank")


def main() -> None:
    out_dir, steps, cases = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    bps.init()
    for case, (params, mu) in cases.items():
        with tf.Graph().as_default():
            checks.run(f"compression_params {case}", partial(momentum_compression, case, params, mu, steps, out_dir))
    for name, check in [("SyncBatchNormalization (Keras 2)", sync_batch_norm),
                        ("broadcast_global_variables", broadcast_global_variables)]:
        with tf.Graph().as_default():
            checks.run(name, check)
    bps.shutdown()
    checks.done()


if __name__ == "__main__":
    main()
