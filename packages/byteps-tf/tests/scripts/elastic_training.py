"""An elastic TensorFlow job for test_elastic.py: ``tape`` / ``tape-eager`` (a custom loop) or ``fit`` (Keras
model.fit; Keras 2 with TF_USE_LEGACY_KERAS=1).

``tape``: one variable of 64 values; each step every rank's gradient is
(rank + 1) * step (from a tf.function, so a lost job comes out of a graph as
AbortedError; ``tape-eager``: computed eagerly, so it comes out of an eager
collective as JobLostError; either prints ``lost in gradient: <class> JobLost <bool>``),
averaged by DistributedGradientTape and subtracted (with BYTEPS_ENABLE_ASYNC=1
each rank subtracts its own and the servers sum the updates); every step
committed.
Prints ``joined <epoch> rank R of N at step S w W`` and ``step S size N w W``.

``fit``: a small Keras model fits random data with Horovod's elastic
callbacks (commit every batch); prints ``joined ...`` at every (re)start,
``batch E B`` after each batch and ``final epoch E checksum C`` at the end.
"""

import sys
import time

import numpy as np
import tensorflow as tf

import byteps.tensorflow as bps
import byteps.tensorflow.keras as bps_keras
from byteps.common import JobLost, api
from byteps.tensorflow.which_keras import keras  # Keras 2 with TF_USE_LEGACY_KERAS=1

mode, steps, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
bps.init()


def membership():
    return api.membership_epoch().number


if mode in ("tape", "tape-eager"):
    w = tf.Variable(tf.zeros([64]))
    state = bps.elastic.TensorFlowState([w], step=0)

    def gradient(scale):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * scale)
        return bps.DistributedGradientTape(tape).gradient(loss, [w])[0]

    if mode == "tape":
        gradient = tf.function(gradient)

    @bps.elastic.run
    def train(state):
        print(f"joined {membership()} rank {bps.rank()} of {bps.size()} at step {state.step} w {w[0].numpy():.9g}",
              flush=True)
        while state.step < steps:
            step = state.step + 1
            try:
                w.assign_sub(gradient(tf.constant(float((bps.rank() + 1) * step))))
            except tf.errors.AbortedError as exc:  # which error a lost job is, eagerly and from a graph
                print(f"lost in gradient: {type(exc).__name__} JobLost {isinstance(exc, JobLost)}", flush=True)
                raise
            state.step = step
            state.commit()
            print(f"step {state.step} size {bps.size()} w {w[0].numpy():.9g}", flush=True)
            time.sleep(pause)

    train(state)
    assert np.all(w.numpy() == w.numpy()[0])
    print(f"final step {state.step} w {w[0].numpy():.9g}", flush=True)
else:
    print(f"keras from {keras.__name__}", flush=True)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(512, 16)).astype("float32"), rng.integers(0, 4, size=512)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(4)])
    model.compile(optimizer=bps_keras.DistributedOptimizer(keras.optimizers.SGD(0.05)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    state = bps_keras.elastic.KerasState(model, batch=0, epoch=0)

    class Pause(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            print(f"batch {state.epoch} {batch}", flush=True)
            time.sleep(pause)

    callbacks = [bps_keras.elastic.CommitStateCallback(state), bps_keras.elastic.UpdateBatchStateCallback(state),
                 bps_keras.elastic.UpdateEpochStateCallback(state), Pause()]

    @bps_keras.elastic.run
    def train(state):
        checksum = sum(float(np.sum(v)) for v in model.get_weights())
        print(f"joined {membership()} rank {bps.rank()} of {bps.size()} at epoch {state.epoch} batch {state.batch} "
              f"checksum {checksum:.6f}", flush=True)
        model.fit(x, y, batch_size=32, epochs=steps - state.epoch, callbacks=callbacks, verbose=0)

    train(state)
    checksum = sum(float(np.sum(v)) for v in model.get_weights())
    print(f"final epoch {state.epoch} checksum {checksum:.6f}", flush=True)
bps.shutdown()
