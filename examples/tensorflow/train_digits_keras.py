"""Data-parallel Keras ``model.fit`` of a small CNN on scikit-learn's digits with byteps.keras.

The data (1,797 8x8 images of handwritten digits) ships inside scikit-learn,
so nothing is downloaded. Each worker fits on its own shard of the training
set; the DistributedOptimizer averages the gradients over all workers every
step, BroadcastGlobalVariablesCallback starts every worker from rank 0's
weights, MetricAverageCallback averages the epoch's metrics and
LearningRateWarmupCallback ramps the learning rate up to the rate scaled by
the number of workers. Run it with the launcher:

    bpslaunch --workers 2 --servers 1 -- python examples/tensorflow/train_digits_keras.py

With BYTEPS_ENABLE_ASYNC=1 in the environment the same script trains
asynchronously (each worker applies its own gradients and the servers add
every worker's change; the learning rate is then not scaled).

It is a Horovod script with one import changed (``horovod.tensorflow.keras``
-> ``byteps.keras``). Rank 0 prints the progress and the held-out accuracy;
every rank exits non-zero if that accuracy is below --min-accuracy.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's start-up chatter out of the progress

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import byteps.keras as bps  # noqa: E402  (was: import horovod.tensorflow.keras as hvd)


def load_data(seed: int) -> tuple:
    digits = load_digits()
    images = (digits.images / 16.0).astype("float32")[..., None]  # N x 8 x 8 x 1 in [0, 1]
    labels = digits.target.astype("int32")
    return train_test_split(images, labels, test_size=0.2, random_state=seed, stratify=labels)


def make_model() -> keras.Model:
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])


class Progress(keras.callbacks.Callback):
    """Rank 0's line per epoch: the (averaged) loss and accuracy and the samples per second of all workers."""

    def __init__(self, samples_per_worker: int) -> None:
        super().__init__()
        self.samples = samples_per_worker * bps.size()

    def on_epoch_begin(self, epoch, logs=None):
        self.started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        elapsed = time.perf_counter() - self.started
        print(f"epoch {epoch + 1:2d}: loss {logs['loss']:.4f}  train accuracy {logs['accuracy']:.3f}  "
              f"lr {logs.get('lr', float('nan')):.4f}  {self.samples / elapsed:.0f} samples/s (all workers)",
              flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.05,
                        help="per worker; scaled by the number of workers when they average gradients (not in "
                             "asynchronous training, BYTEPS_ENABLE_ASYNC=1, where every worker's step lands)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fp16-pushpull", action="store_true", help="send gradients as float16")
    parser.add_argument("--min-accuracy", type=float, default=0.9)
    args = parser.parse_args()

    bps.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)  # a model this small only loses time to more threads
    keras.utils.set_random_seed(args.seed + bps.rank())  # different initial weights: the broadcast must fix that
    x_train, x_test, y_train, y_test = load_data(args.seed)
    x_mine, y_mine = x_train[bps.rank()::bps.size()], y_train[bps.rank()::bps.size()]

    model = make_model()
    # Averaged gradients take n workers' worth of data per step: scale the rate (Horovod's rule). In
    # asynchronous training every worker's own step is added to the servers' parameters: keep it.
    scale = 1 if os.environ.get("BYTEPS_ENABLE_ASYNC", "0") == "1" else bps.size()
    optimizer = bps.DistributedOptimizer(
        keras.optimizers.SGD(args.lr * scale, momentum=0.9),
        compression=bps.Compression.fp16 if args.fp16_pushpull else bps.Compression.none)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    callbacks = [
        bps.callbacks.BroadcastGlobalVariablesCallback(0),
        bps.callbacks.MetricAverageCallback(),
        bps.callbacks.LearningRateWarmupCallback(initial_lr=args.lr * scale, warmup_epochs=2),
    ]
    if bps.rank() == 0:
        callbacks.append(Progress(len(x_mine)))
        steps = -(-len(x_mine) // args.batch_size)
        print(f"training on {len(x_train)} images with {bps.size()} worker(s), "
              f"{len(x_mine)} images and {steps} steps per worker per epoch", flush=True)
    model.fit(x_mine, y_mine, batch_size=args.batch_size, epochs=args.epochs, shuffle=True, verbose=0,
              callbacks=callbacks)

    logits = model.predict(x_test, batch_size=256, verbose=0)
    accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
    if bps.rank() == 0:
        print(f"held-out accuracy {accuracy:.3f} on {len(x_test)} images", flush=True)
    bps.shutdown()
    if accuracy < args.min_accuracy:
        print(f"accuracy {accuracy:.3f} is below --min-accuracy {args.min_accuracy}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
