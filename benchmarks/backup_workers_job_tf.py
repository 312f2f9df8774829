"""One worker of bench_backup_workers.py for TensorFlow: the Keras digits example's model and data, emulated compute.

Usage (under bpslaunch): python backup_workers_job_tf.py --step-ms 20 --slowdown 3 --straggler random|fixed [--skip]
The TensorFlow twin of backup_workers_job.py (torch), with the same
arguments and output. Keras ``model.fit`` trains the model of
examples/tensorflow/train_digits_keras.py on each worker's shard of the
digits, batches of 32, SGD(0.05 x workers, momentum 0.9) through byteps'
DistributedOptimizer. Each step first "computes" for --step-ms (a sleep,
inside fit's train function: the machine has too few cores to make three
workers' real compute the thing measured); the straggler of the step takes
--slowdown times as long. ``random``: a different worker each step (the
same choice on every rank, from the step number), as stragglers come and
go on a shared cluster; ``fixed``: the last rank is always the straggler.
With --skip, ``SkipStepCallback`` asks the optimizer's ``skip_step()``
before each batch, so a worker that fell behind skips the batches of
rounds that closed without it (no sleep, no forward or backward pass).
Trains --epochs over the digits, then every rank prints its wall time (from
the end of the first step, which traces the train function, to the end of
training), held-out accuracy, steps, steps computed and a checksum of its
parameters as one JSON line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "tensorflow"))
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from backup_workers_contract import emulate_compute, parse_args, report  # noqa: E402
from train_digits_keras import load_data, make_model  # noqa: E402

import byteps.keras as bps  # noqa: E402


class EmulatedCompute(keras.callbacks.Callback):
    """Sleeps in fit's train function (so a batch that SkipStepCallback drops does not): the straggler longer."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.step = 0          # every batch, skipped or not: the same step numbers on every rank
        self.computed = 0
        self.first_done = None  # when the first step ended (it traces the train function)

    def on_train_begin(self, logs=None):
        inner = self.model.train_function

        def train_function(iterator):
            emulate_compute(self.step, bps.rank(), bps.size(), self.args)
            self.computed += 1
            return inner(iterator)

        self.model.train_function = train_function

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        self.first_done = self.first_done or time.perf_counter()


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    bps.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    keras.utils.set_random_seed(bps.rank())  # different initial weights: the broadcast makes them equal
    x_train, x_test, y_train, y_test = load_data(0)
    x_mine, y_mine = x_train[bps.rank()::bps.size()], y_train[bps.rank()::bps.size()]
    model = make_model()
    optimizer = bps.DistributedOptimizer(keras.optimizers.SGD(0.05 * bps.size(), momentum=0.9))
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    compute = EmulatedCompute(args)
    # SkipStepCallback after EmulatedCompute: it wraps the train function that sleeps, so a skip sleeps not.
    callbacks = [bps.callbacks.BroadcastGlobalVariablesCallback(0), compute,
                 *([bps.callbacks.SkipStepCallback()] if args.skip else [])]
    model.fit(x_mine, y_mine, batch_size=32, epochs=args.epochs, shuffle=True, verbose=0, callbacks=callbacks)
    wall = time.perf_counter() - compute.first_done
    logits = model.predict(x_test, batch_size=256, verbose=0)
    accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
    # Backup workers keep the replicas identical: every rank applies every round's average.
    checksum = float(sum(np.sum(v.numpy().astype(np.float64)) for v in model.trainable_variables))
    report(bps.rank(), wall, accuracy, compute.step, compute.computed, checksum)
    bps.shutdown()


if __name__ == "__main__":
    main()
