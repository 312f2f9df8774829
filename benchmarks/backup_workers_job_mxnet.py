"""One MXNet worker of bench_backup_workers.py: the digits example's gluon model and data, with emulated compute.

Usage (under bpslaunch): python backup_workers_job_mxnet.py --step-ms 20 --slowdown 3 --straggler random|fixed
[--skip]. The same job as backup_workers_job.py (torch), through
bps.DistributedTrainer: each step first "computes" for --step-ms (a sleep:
the machine has too few cores to make three workers' real compute the
thing measured); the straggler of the step takes --slowdown times as long.
``random``: a different worker each step (the same choice on every rank,
from the step number); ``fixed``: the last rank is always the straggler.
With --skip the loop asks ``trainer.skip_step(batch_size)`` first, so a
worker that fell behind skips the batches of rounds that closed without it.
Trains --epochs over the digits, then every rank prints its wall time,
held-out accuracy, steps, steps computed and a checksum of its parameters
as one JSON line.
"""

from __future__ import annotations

import os
import sys
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "mxnet"))
from backup_workers_contract import emulate_compute, parse_args, report  # noqa: E402
from train_digits import digits_net, load_data  # noqa: E402

import byteps.mxnet as bps  # noqa: E402

BATCH, LR = 32, 0.05  # per worker, as in the example (the rate is scaled by the number of workers)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    bps.init()
    mx.random.seed(bps.rank())  # different initial weights: the trainer's broadcast makes them rank 0's
    train_x, test_x, train_y, test_y = load_data(0)
    net = digits_net()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    trainer = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": LR * bps.size(), "momentum": 0.9})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    shard = np.arange(len(train_y))[bps.rank()::bps.size()]
    steps_per_epoch = len(train_y) // bps.size() // BATCH  # the same on every rank: one round per step
    rng = np.random.RandomState(bps.rank())
    started, step, computed = time.perf_counter(), 0, 0
    for _ in range(args.epochs):
        order = rng.permutation(shard)
        for index in range(steps_per_epoch):
            batch = order[index * BATCH:(index + 1) * BATCH]
            if args.skip and trainer.skip_step(len(batch)):
                step += 1
                continue
            computed += 1
            emulate_compute(step, bps.rank(), bps.size(), args)
            images, labels = mx.nd.array(train_x[batch]), mx.nd.array(train_y[batch])
            with autograd.record():
                loss = loss_fn(net(images), labels)
            loss.backward()
            trainer.step(len(batch))
            step += 1
    mx.nd.waitall()
    wall = time.perf_counter() - started
    predictions = net(mx.nd.array(test_x)).argmax(axis=1).asnumpy()
    accuracy = float((predictions == test_y).mean())
    # Backup workers keep the replicas identical: every rank applies every round's average.
    checksum = float(sum(p.data().asnumpy().astype(np.float64).sum() for p in net.collect_params().values()))
    report(bps.rank(), wall, accuracy, step, computed, checksum)
    bps.shutdown()


if __name__ == "__main__":
    main()
