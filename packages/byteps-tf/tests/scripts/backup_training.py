"""Worker script: backup workers in TensorFlow, the last worker slow, skipping the rounds that closed without it.

Usage: python backup_training.py MODE STEPS SLEEP_S, MODE one of
``eager`` (a plain loop, the tape's step run eagerly), ``function`` (the
step a ``tf.function``), both asking ``bps.skip_step(optimizer, variables)``
first, ``fit`` (Keras ``model.fit`` with ``SkipStepCallback``; Keras 2 with
TF_USE_LEGACY_KERAS=1), and in a TF1 graph (eager execution disabled, each
step a ``tf.compat.v1.Session`` run): ``tf1-tape`` (a tape in the graph, a
TF1 ``GradientDescentOptimizer``, ``bps.skip_step(optimizer, variables,
session)``) and ``tf1-optimizer`` (the TF1 ``DistributedOptimizer``'s
``minimize``, ``opt.skip_step(session)``); ``optimizer-eager`` is the latter
used eagerly (``opt.skip_step()``). The last
rank sleeps SLEEP_S in each batch it computes (in ``fit``, inside the train
function the callback wraps, so a skipped batch does not sleep).

The loss is ``mean(x @ w)``: its gradient, the batch's mean row, does not
depend on the weights, and rank r's rows at step k are ``(k + 1) * e_r``.
A round's average is thus ``(k + 1) / m`` at the places of the ranks whose
pushes made it (m of them), which tells which ranks and which step made
each update. Prints one JSON line per rank: the batches it computed, its
time after the first step (which traces, and is slow on a shared machine),
and the weights after every step.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import tensorflow as tf

if sys.argv[1].startswith("tf1-"):
    tf.compat.v1.disable_eager_execution()

import byteps.tensorflow as bps  # noqa: E402

LR = 0.01


def batch(step: int, rank: int, size: int) -> np.ndarray:
    row = np.zeros(size, np.float32)
    row[rank] = step + 1
    return np.tile(row, (4, 1))


def tape_loop(mode: str, steps: int, sleep_s: float, slow: bool):
    import keras
    w = tf.Variable(tf.zeros([bps.size(), 1]))
    optimizer = keras.optimizers.SGD(LR)

    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(x @ w)
        gradients = bps.DistributedGradientTape(tape).gradient(loss, [w])
        optimizer.apply_gradients(zip(gradients, [w]))

    run = tf.function(step) if mode == "function" else step
    computed, trajectory, started = 0, [], None
    for k in range(steps):
        x = tf.constant(batch(k, bps.rank(), bps.size()))
        if not bps.skip_step(optimizer, [w]):
            computed += 1
            if slow:
                time.sleep(sleep_s)
            run(x)
        trajectory.append(w.numpy().ravel().tolist())
        started = started or time.monotonic()  # after the first step, which traces the tf.function
    return computed, trajectory, time.monotonic() - started


def graph_loop(mode: str, steps: int, sleep_s: float, slow: bool):
    v1 = tf.compat.v1
    w = v1.get_variable("w", initializer=tf.zeros([bps.size(), 1]))
    x = v1.placeholder(tf.float32, [4, bps.size()])
    if mode == "tf1-tape":
        optimizer = v1.train.GradientDescentOptimizer(LR)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(x @ w)
        gradients = bps.DistributedGradientTape(tape).gradient(loss, [w])
        train = optimizer.apply_gradients(zip(gradients, [w]))
    else:
        optimizer = bps.DistributedOptimizer(v1.train.GradientDescentOptimizer(LR))
        train = optimizer.minimize(tf.reduce_mean(x @ w), var_list=[w])
    computed, trajectory, started = 0, [], None
    with v1.Session() as session:
        session.run(v1.global_variables_initializer())
        for k in range(steps):
            skipped = (bps.skip_step(optimizer, [w], session) if mode == "tf1-tape"
                       else optimizer.skip_step(session))
            if not skipped:
                computed += 1
                if slow:
                    time.sleep(sleep_s)
                session.run(train, {x: batch(k, bps.rank(), bps.size())})
            trajectory.append(session.run(w).ravel().tolist())
            started = started or time.monotonic()
    return computed, trajectory, time.monotonic() - started


def eager_optimizer_loop(steps: int, sleep_s: float, slow: bool):
    """The TF1 ``DistributedOptimizer`` used eagerly: ``opt.skip_step()``, else ``opt.minimize``."""
    w = tf.Variable(tf.zeros([bps.size(), 1]))
    optimizer = bps.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(LR))
    computed, trajectory, started = 0, [], None
    for k in range(steps):
        x = tf.constant(batch(k, bps.rank(), bps.size()))
        if not optimizer.skip_step():
            computed += 1
            if slow:
                time.sleep(sleep_s)
            optimizer.minimize(lambda x=x: tf.reduce_mean(x @ w), var_list=[w])
        trajectory.append(w.numpy().ravel().tolist())
        started = started or time.monotonic()
    return computed, trajectory, time.monotonic() - started


def fit_loop(steps: int, sleep_s: float, slow: bool):
    import byteps.tensorflow.keras as bpk
    from byteps.tensorflow.which_keras import keras  # Keras 2 with TF_USE_LEGACY_KERAS=1

    class SlowCompute(keras.callbacks.Callback):
        """The slow rank's compute: a sleep inside the train function (SkipStepCallback wraps it after)."""

        def on_train_begin(self, logs=None):
            inner = self.model.train_function

            def train_function(iterator):
                if slow:
                    time.sleep(sleep_s)
                return inner(iterator)

            self.model.train_function = train_function

    class Trajectory(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.weights, self.started = [], None

        def on_train_batch_end(self, batch_index, logs=None):
            self.weights.append(self.model.layers[-1].kernel.numpy().ravel().tolist())
            self.started = self.started or time.monotonic()  # after the first batch, which traces

    model = keras.Sequential([keras.Input((bps.size(),)),
                              keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    model.compile(optimizer=bpk.DistributedOptimizer(keras.optimizers.SGD(LR)),
                  loss=lambda y_true, y_pred: y_pred[:, 0])  # gradient: the batch's mean row
    x = np.concatenate([batch(k, bps.rank(), bps.size()) for k in range(steps)])
    skipping, trajectory = bpk.callbacks.SkipStepCallback(), Trajectory()
    model.fit(x, np.zeros(len(x), np.float32), batch_size=4, epochs=1, shuffle=False, verbose=0,
              callbacks=[SlowCompute(), skipping, trajectory])
    return steps - skipping.skipped, trajectory.weights, time.monotonic() - trajectory.started


def main() -> None:
    mode, steps, sleep_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    tf.config.threading.set_intra_op_parallelism_threads(1)
    bps.init()
    slow = bps.rank() == bps.size() - 1
    if mode == "fit":
        computed, trajectory, seconds = fit_loop(steps, sleep_s, slow)
    elif mode == "optimizer-eager":
        computed, trajectory, seconds = eager_optimizer_loop(steps, sleep_s, slow)
    elif mode.startswith("tf1-"):
        computed, trajectory, seconds = graph_loop(mode, steps, sleep_s, slow)
    else:
        computed, trajectory, seconds = tape_loop(mode, steps, sleep_s, slow)
    print("RESULT " + json.dumps({"rank": bps.rank(), "computed": computed, "seconds": seconds,
                                  "trajectory": trajectory}), flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
