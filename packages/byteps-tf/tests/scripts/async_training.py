"""Asynchronous training (BYTEPS_ENABLE_ASYNC=1) on every rank: timing, exactly-once, the servers' store.

Usage: python async_training.py OUT_DIR MODE STEPS SLOW_RANK SLEEP_S

MODE is how the script trains, unchanged from a synchronous script:

* ``fit``: Keras ``model.fit`` with ``bps.DistributedOptimizer`` (its step a tf.function);
* ``tape``: ``bps.DistributedGradientTape`` and a plain Keras optimizer in a tf.function;
* ``tape-eager``: the same loop eagerly;
* ``tf1-graph``: a TF1 ``GradientDescentOptimizer`` wrapped by ``bps.DistributedOptimizer``
  in a TF1 graph, run step by step in a ``tf.compat.v1.Session``.

Each rank starts from its own random weights (the first exchange must give
them rank 0's), trains on its own data, and SLOW_RANK sleeps SLEEP_S per
step. Every delta the exchange pushes is recorded (its subtraction is
wrapped). After the loop (for the tape: after pushing its last update) a
barrier, then one exchange of a zero delta returns the servers' store,
which holds every rank's every delta. Each rank writes OUT_DIR/rank<r>.pkl:
its initial weights, the sum of its deltas, the final weights, the time of
each completed step and its count of pushes.
"""

from __future__ import annotations

import os
import pickle
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import byteps.tensorflow as bps  # noqa: E402
from byteps.tensorflow import async_training  # noqa: E402

BATCH = 32


def data(steps: int):
    rng = np.random.default_rng(bps.rank())
    x = rng.standard_normal((steps * BATCH, 16)).astype("float32")
    return x, (x[:, 0] > 0).astype("int32")


def make_model() -> keras.Model:
    keras.utils.set_random_seed(1234 + bps.rank())  # different initial weights: the first exchange fixes that
    return keras.Sequential([keras.Input((16,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(2)])


class Clock:
    """Each completed step's time since the loop began; the slow rank sleeps before each step."""

    def __init__(self, slow_rank: int, sleep_s: float) -> None:
        self.sleep_s = sleep_s if bps.rank() == slow_rank else 0.0
        self.times, self.started = [], time.monotonic()

    def before_step(self) -> None:
        if self.sleep_s:
            time.sleep(self.sleep_s)

    def after_step(self) -> None:
        self.times.append(time.monotonic() - self.started)


class ClockCallback(keras.callbacks.Callback):
    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    def on_train_batch_begin(self, batch, logs=None):
        self.clock.before_step()

    def on_train_batch_end(self, batch, logs=None):
        self.clock.after_step()


def record_deltas(exchange, deltas, pushes) -> None:
    """Wrap the exchange's subtraction: every delta it pushes is summed into ``deltas`` and counted."""
    parameters = exchange.parameters
    subtract = parameters.ops.subtract

    def recording_subtract(after, before):
        delta = subtract(after, before)
        pushes[0] += 1
        name = parameters.names[(pushes[0] - 1) % len(parameters.names)]  # the exchange goes in name order
        deltas[name] = deltas.get(name, 0) + delta.astype(np.float64)
        return delta

    parameters.ops = parameters.ops.__class__(parameters.ops.copy, recording_subtract, parameters.ops.zeros_like)


def weights(variables) -> list:
    return [np.array(v.numpy(), dtype=np.float64) for v in variables]


def train_fit(steps: int, clock: Clock, deltas, pushes):
    model = make_model()
    optimizer = bps.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.5))
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    optimizer.build(model.trainable_variables)
    exchange = optimizer._byteps_exchange
    record_deltas(exchange, deltas, pushes)
    initial = weights(model.trainable_variables)
    x, y = data(steps)
    clock.started = time.monotonic()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[ClockCallback(clock)])
    bps.barrier()
    exchange.around(lambda: None)  # a zero delta: the store with every delta in it
    return exchange, initial, weights(model.trainable_variables)


def train_tape(steps: int, clock: Clock, deltas, pushes, eager: bool):
    model = make_model()
    optimizer = keras.optimizers.SGD(0.05, momentum=0.5)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = data(steps)

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        tape = bps.DistributedGradientTape(tape)  # the usual script: a new wrapper every step
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    step = step if eager else tf.function(step)
    model(x[:1])
    initial = weights(model.trainable_variables)
    clock.started = time.monotonic()
    for i in range(steps):
        clock.before_step()
        step(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH])
        clock.after_step()
        if i == 0:  # the first gradient() made the exchange (and broadcast): its deltas start with step 2's
            exchange = async_training.tape_exchange(model.trainable_variables)
            record_deltas(exchange, deltas, pushes)
    async_training.push_tape_updates()  # the last step's update
    bps.barrier()
    async_training.push_tape_updates()  # a zero delta: the store
    return exchange, initial, weights(model.trainable_variables)


def train_tf1_graph(steps: int, clock: Clock, deltas, pushes):
    x_all, y_all = data(steps)
    rng = np.random.default_rng(1234 + bps.rank())
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=rng.standard_normal((16, 2)).astype("float32"))
        b = tf.compat.v1.get_variable("b", initializer=rng.standard_normal(2).astype("float32"))
        x = tf.compat.v1.placeholder(tf.float32, (BATCH, 16))
        y = tf.compat.v1.placeholder(tf.int32, (BATCH,))
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=x @ w + b))
        optimizer = bps.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.05))
        train = optimizer.minimize(loss, var_list=[w, b])
        exchange = optimizer._exchanges.get([w, b])
        record_deltas(exchange, deltas, pushes)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            initial = [np.array(v, np.float64) for v in session.run([w, b])]
            clock.started = time.monotonic()
            for i in range(steps):
                clock.before_step()
                session.run(train, {x: x_all[i * BATCH:(i + 1) * BATCH], y: y_all[i * BATCH:(i + 1) * BATCH]})
                clock.after_step()
            values = dict(zip(exchange.parameters.names, [np.array(v) for v in session.run([w, b])]))
    bps.barrier()
    # A zero delta, straight through the exchange's numpy side: in a TF1 graph a second byteps op would be
    # ordered after the training op and run it again.
    exchange.parameters.exchange(exchange.parameters.snapshot(values), values)
    return exchange, initial, [np.array(values[name], np.float64) for name in exchange.parameters.names]


def main() -> None:
    out_dir, mode, steps, slow_rank, sleep_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \
        float(sys.argv[5])
    tf.config.threading.set_intra_op_parallelism_threads(1)
    bps.init()
    clock, deltas, pushes = Clock(slow_rank, sleep_s), {}, [0]
    if mode == "fit":
        exchange, initial, final = train_fit(steps, clock, deltas, pushes)
    elif mode in ("tape", "tape-eager"):
        exchange, initial, final = train_tape(steps, clock, deltas, pushes, eager=mode == "tape-eager")
    elif mode == "tf1-graph":
        exchange, initial, final = train_tf1_graph(steps, clock, deltas, pushes)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    names = exchange.parameters.names
    with open(os.path.join(out_dir, f"rank{bps.rank()}.pkl"), "wb") as out:
        pickle.dump({"names": names, "initial": dict(zip(names, initial)), "final": dict(zip(names, final)),
                     "deltas": deltas, "pushes": pushes[0], "times": clock.times}, out)
    print(f"async {mode} rank {bps.rank()} OK: {steps} steps in {clock.times[-1]:.2f} s", flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
