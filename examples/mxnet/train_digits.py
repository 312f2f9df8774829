"""Data-parallel training of a small gluon CNN on scikit-learn's digits with byteps.mxnet.

The data (1,797 8x8 images of handwritten digits) ships inside scikit-learn,
so nothing is downloaded. Each worker trains on its own shard of the
training set, reshuffled every epoch; DistributedTrainer broadcasts rank 0's
initial weights and averages the gradients over all workers every step, so
all workers keep identical weights. Run it with the launcher:

    bpslaunch --workers 2 --servers 1 -- python examples/mxnet/train_digits.py

With BYTEPS_ENABLE_ASYNC=1 the same script trains asynchronously: each
worker steps on its own gradients and the servers add every worker's
change to the parameters they keep (the learning rate is then not scaled).

Rank 0 prints the progress and the held-out accuracy; the script exits
non-zero if that accuracy is below --min-accuracy.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import byteps.mxnet as bps


def digits_net() -> nn.HybridSequential:
    net = nn.HybridSequential(prefix="digits_")
    with net.name_scope():
        net.add(nn.Conv2D(16, 3, padding=1, activation="relu"),
                nn.Conv2D(32, 3, padding=1, activation="relu"),
                nn.MaxPool2D(2),
                nn.Flatten(),
                nn.Dense(64, activation="relu"),
                nn.Dense(10))
    return net


def load_data(seed: int) -> tuple:
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None, :, :]   # N x 1 x 8 x 8 in [0, 1]
    labels = digits.target.astype(np.float32)
    return train_test_split(images, labels, test_size=0.2, random_state=seed, stratify=digits.target)


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
    mx.random.seed(args.seed + bps.rank())   # different initial weights: the trainer's broadcast must fix that
    train_x, test_x, train_y, test_y = load_data(args.seed)

    net = digits_net()
    net.initialize(mx.init.Xavier())         # shapes are inferred in the first forward pass
    net.hybridize()
    # Averaged gradients take n workers' worth of data per step: scale the rate (Horovod's rule). In
    # asynchronous training every worker's own step is added to the servers' parameters: keep it.
    scale = 1 if os.environ.get("BYTEPS_ENABLE_ASYNC", "0") == "1" else bps.size()
    trainer = bps.DistributedTrainer(
        net.collect_params(), "sgd", {"learning_rate": args.lr * scale, "momentum": 0.9},
        compression=bps.Compression.fp16 if args.fp16_pushpull else bps.Compression.none)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    shard = np.arange(len(train_y))[bps.rank()::bps.size()]
    steps = len(shard) // args.batch_size     # the same on every worker: every step is a push_pull on every rank
    if bps.rank() == 0:
        print(f"training on {len(train_y)} images with {bps.size()} worker(s), "
              f"{steps * args.batch_size} images and {steps} steps per worker per epoch", flush=True)
    rng = np.random.RandomState(args.seed + bps.rank())
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(shard)
        started = time.perf_counter()
        loss_sum, correct = mx.nd.zeros((1,)), mx.nd.zeros((1,))
        for step in range(steps):
            batch = order[step * args.batch_size:(step + 1) * args.batch_size]
            images, labels = mx.nd.array(train_x[batch]), mx.nd.array(train_y[batch])
            with autograd.record():
                logits = net(images)
                loss = loss_fn(logits, labels)
            loss.backward()
            trainer.step(len(batch))
            loss_sum += loss.sum()
            correct += (logits.argmax(axis=1) == labels).sum()
        seen = steps * args.batch_size
        loss_mean, accuracy = loss_sum.asscalar() / seen, correct.asscalar() / seen   # waits for the epoch
        elapsed = time.perf_counter() - started
        if bps.rank() == 0:
            print(f"epoch {epoch:2d}: loss {loss_mean:.4f}  train accuracy {accuracy:.3f}  "
                  f"{seen * bps.size() / elapsed:.0f} samples/s (all workers)", flush=True)

    predictions = net(mx.nd.array(test_x)).argmax(axis=1).asnumpy()
    held_out = float((predictions == test_y).mean())
    if bps.rank() == 0:
        print(f"held-out accuracy {held_out:.3f} on {len(test_y)} images", flush=True)
    mx.nd.waitall()
    bps.shutdown()
    if held_out < args.min_accuracy:
        print(f"accuracy {held_out:.3f} is below --min-accuracy {args.min_accuracy}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
