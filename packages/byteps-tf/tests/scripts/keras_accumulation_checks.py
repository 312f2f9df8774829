"""Worker script: Keras ``DistributedOptimizer(backward_passes_per_step=N)`` against one process on the combined batch.

Run under bpslaunch (2 ranks). Every optimizer step of the distributed run
is N backward passes per rank, each on its own micro-batch; the reference,
computed by every rank itself with a plain Keras optimizer, takes the mean
gradient over all ``size() * N`` micro-batches of that step and applies it
in one optimizer step. After ``STEPS`` steps the weights *and* the
optimizer's state (iteration count, momentum buffers, Adam's moments) must
match the reference within float32 tolerance, for SGD with momentum and for
Adam, with N = 1 and N = 2, through ``model.fit``, a ``tf.function`` loop
and an eager loop.

Horovod's default ``average_aggregated_gradients=False`` applies the *sum*
of the N passes' gradients (averaged over workers): N times the mean,
which the reference then applies instead (checked through ``model.fit``).

The state must also survive a save: a model saved after half the steps
loads into a plain Keras optimizer with the same state, and through
``bps.load_model(..., backward_passes_per_step=2)`` finishes the run as
if never interrupted.

Each equivalence prints ``equivalence <label>: largest difference <x>``
for the test to read back.
"""

from __future__ import annotations

import os
from functools import partial
from typing import Callable, Dict, List, Tuple

import keras
import numpy as np
import tensorflow as tf
from check_runner import Checks, assert_close

import byteps.keras as bps

STEPS, MICRO, FEATURES, OUTPUTS = 4, 4, 5, 3
OPTIMIZERS: Dict[str, Callable[[], keras.optimizers.Optimizer]] = {
    "SGD(momentum=0.9)": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "Adam": lambda: keras.optimizers.Adam(0.01),
}
checks = Checks()


def make_model() -> keras.Model:
    keras.utils.set_random_seed(5)   # every model (every rank, the reference) starts from the same weights
    return keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(8, activation="tanh"),
        keras.layers.Dense(OUTPUTS),
    ])


def micro_batches(passes: int) -> Tuple[np.ndarray, np.ndarray]:
    """Every micro-batch of the run, indexed [step, rank, pass], the same arrays on every rank."""
    rng = np.random.default_rng(17 + passes)
    shape = (STEPS, bps.size(), passes, MICRO)
    x = rng.normal(size=(*shape, FEATURES)).astype("float32")
    y = rng.normal(size=(*shape, OUTPUTS)).astype("float32")
    return x, y


def state(optimizer: keras.optimizers.Optimizer) -> List[np.ndarray]:
    """The optimizer's variables (iterations, learning rate, slots): what it saves, loads and broadcasts."""
    return [keras.ops.convert_to_numpy(v) for v in optimizer.variables]


def reference(optimizer_name: str, passes: int, scale: float):
    """One process: per step, ``scale`` times the mean gradient of all size() * passes micro-batches, applied once."""
    x, y = micro_batches(passes)
    model = make_model()
    optimizer = OPTIMIZERS[optimizer_name]()
    loss_fn = keras.losses.MeanSquaredError()
    for step in range(STEPS):
        gradients = []
        for rank in range(bps.size()):
            for p in range(passes):
                with tf.GradientTape() as tape:
                    loss = loss_fn(y[step, rank, p], model(x[step, rank, p], training=True))
                gradients.append(tape.gradient(loss, model.trainable_variables))
        mean = [tf.add_n(list(parts)) / len(parts) * scale for parts in zip(*gradients)]
        optimizer.apply_gradients(zip(mean, model.trainable_variables))
    return model.get_weights(), state(optimizer)


def fit_steps(model: keras.Model, passes: int, steps: range) -> None:
    """model.fit on this rank's micro-batches of ``steps``, one batch per backward pass."""
    x, y = micro_batches(passes)
    mine_x, mine_y = x[steps.start:steps.stop, bps.rank()], y[steps.start:steps.stop, bps.rank()]
    model.fit(mine_x.reshape(-1, FEATURES), mine_y.reshape(-1, OUTPUTS), batch_size=MICRO, epochs=1,
              shuffle=False, verbose=0)


def train(optimizer: keras.optimizers.Optimizer, passes: int, loop: str) -> keras.Model:
    """This rank's share: its micro-batches of every step, in order, one backward pass each."""
    x, y = micro_batches(passes)
    mine_x, mine_y = x[:, bps.rank()], y[:, bps.rank()]
    model = make_model()
    if loop == "fit":
        model.compile(optimizer=optimizer, loss="mse")
        fit_steps(model, passes, range(STEPS))
        return model
    loss_fn = keras.losses.MeanSquaredError()

    def backward_pass(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))

    if loop == "tf.function":
        backward_pass = tf.function(backward_pass)
    for step in range(STEPS):
        before = [w.copy() for w in model.get_weights()]
        for p in range(passes):
            backward_pass(mine_x[step, p], mine_y[step, p])
            if p < passes - 1:   # a pass that is not the N-th applies nothing and counts no iteration
                assert int(optimizer.iterations.numpy()) == step, (step, p, int(optimizer.iterations.numpy()))
                for now, then in zip(model.get_weights(), before):
                    assert np.array_equal(now, then), f"weights changed at pass {p + 1} of {passes}"
    return model


def compare(label: str, model: keras.Model, optimizer: keras.optimizers.Optimizer, expected) -> None:
    """Weights and optimizer state against the reference's; prints the largest difference for the test."""
    want_weights, want_state = expected
    assert int(optimizer.iterations.numpy()) == STEPS, f"{label}: iterations {int(optimizer.iterations.numpy())}"
    got_state = state(optimizer)
    # the same variables as the plain optimizer: Keras loads a saved optimizer state only when the counts agree
    assert len(got_state) == len(want_state), f"{label}: {len(got_state)} optimizer variables, want {len(want_state)}"
    worst = 0.0
    for i, (got, want) in enumerate(zip(model.get_weights() + got_state, want_weights + want_state)):
        assert_close(got, want, f"{label}: value {i}")
        worst = max(worst, float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))))
    print(f"equivalence {label}: largest difference {worst:.2e}", flush=True)


def distributed(optimizer_name: str, passes: int, average_aggregated_gradients: bool) -> keras.optimizers.Optimizer:
    return bps.DistributedOptimizer(OPTIMIZERS[optimizer_name](), backward_passes_per_step=passes,
                                    average_aggregated_gradients=average_aggregated_gradients)


def equivalence(optimizer_name: str, passes: int, loop: str, average_aggregated_gradients: bool = True) -> None:
    label = f"{optimizer_name} bpps={passes} average_aggregated_gradients={average_aggregated_gradients} {loop}"
    scale = 1.0 if average_aggregated_gradients or passes == 1 else float(passes)
    expected = reference(optimizer_name, passes, scale)
    optimizer = distributed(optimizer_name, passes, average_aggregated_gradients)
    compare(label, train(optimizer, passes, loop), optimizer, expected)


def resumed(optimizer_name: str, directory: str) -> None:
    """Half the steps, save, load (plainly: the same state; with bps.load_model: go on), the other half."""
    passes, half = 2, STEPS // 2
    expected = reference(optimizer_name, passes, 1.0)
    model = make_model()
    model.compile(optimizer=distributed(optimizer_name, passes, True), loss="mse")
    fit_steps(model, passes, range(half))
    path = os.path.join(directory, f"rank{bps.rank()}.{optimizer_name.split('(')[0]}.keras")
    model.save(path)
    plain = keras.models.load_model(path)
    assert type(plain.optimizer) is type(OPTIMIZERS[optimizer_name]()), type(plain.optimizer)
    saved = state(model.optimizer)
    assert len(state(plain.optimizer)) == len(saved), (len(state(plain.optimizer)), len(saved))
    for i, (got, want) in enumerate(zip(state(plain.optimizer), saved)):
        assert_close(got, want, f"plain load_model: optimizer variable {i}", rtol=0, atol=0)
    loaded = bps.load_model(path, backward_passes_per_step=passes, average_aggregated_gradients=True)
    assert int(loaded.optimizer.iterations.numpy()) == half, int(loaded.optimizer.iterations.numpy())
    fit_steps(loaded, passes, range(half, STEPS))
    compare(f"{optimizer_name} bpps={passes} saved after {half} steps, loaded, resumed", loaded, loaded.optimizer,
            expected)


def main() -> None:
    tf.config.threading.set_intra_op_parallelism_threads(1)
    bps.init()
    assert bps.size() in (2, 4), bps.size()  # 4: two machines of two (tests/matrix)
    directory = os.environ["BYTEPS_TEST_TMP"]
    for name in OPTIMIZERS:
        checks.run(f"{name}, backward_passes_per_step=1, model.fit", partial(equivalence, name, 1, "fit"))
        for loop in ("fit", "tf.function", "eager"):
            checks.run(f"{name}, backward_passes_per_step=2, averaged, {loop}", partial(equivalence, name, 2, loop))
        checks.run(f"{name}, backward_passes_per_step=2, summed (Horovod's default), model.fit",
                   partial(equivalence, name, 2, "fit", average_aggregated_gradients=False))
        checks.run(f"{name}, backward_passes_per_step=2, saved, loaded and resumed", partial(resumed, name, directory))
    bps.shutdown()
    checks.done()


if __name__ == "__main__":
    main()
