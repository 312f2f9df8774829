"""Backup workers in MXNet: the last rank is slow and skips the rounds that closed without it.

Usage: python backup_training.py OUT_DIR STEPS SLEEP_S {trainer,optimizer}
Every rank trains a small gluon model with momentum SGD on its own data for
STEPS batches, through bps.DistributedTrainer ("trainer") or a gluon Trainer
with kvstore=None over bps.DistributedOptimizer ("optimizer"), asking
``skip_step`` first; the last rank sleeps SLEEP_S in each batch it computes.
Each rank writes OUT_DIR/rank<r>.pkl: the parameters it started from, for
each step whether it computed it, its own gradient (computed steps) and the
averaged gradient it stepped with (read back after the step: the push_pull
writes the average in place), its final parameters and its time.
"""

from __future__ import annotations

import pickle
import sys
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import byteps.mxnet as bps

LR, MOMENTUM, BATCH = 0.1, 0.9, 16


def main() -> None:
    out_dir, steps, sleep_s, mode = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    bps.init()
    mx.random.seed(1234 + bps.rank())  # different initial weights: training starts from rank 0's
    net = gluon.nn.Sequential(prefix="backup_")
    with net.name_scope():
        net.add(gluon.nn.Dense(16, in_units=8, activation="tanh"), gluon.nn.Dense(2, in_units=16))
    net.initialize(mx.init.Xavier())
    sgd = {"learning_rate": LR, "momentum": MOMENTUM}
    if mode == "trainer":
        trainer = bps.DistributedTrainer(net.collect_params(), "sgd", sgd)
        skip_step = trainer.skip_step
    else:
        bps.broadcast_parameters(net.collect_params(), root_rank=0)
        optimizer = bps.DistributedOptimizer(mx.optimizer.SGD(**sgd))
        trainer = gluon.Trainer(net.collect_params(), optimizer, kvstore=None)

        def skip_step(batch_size):
            return optimizer.skip_step(trainer, batch_size)

    params = sorted(net.collect_params().values(), key=lambda p: p.name)
    initial = {p.name: p.data().asnumpy() for p in params}
    slow = bps.rank() == bps.size() - 1
    rng = np.random.RandomState(bps.rank())
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    computed, local, applied, started = [], [], [], time.monotonic()
    for _ in range(steps):
        x = rng.randn(BATCH, 8).astype(np.float32)
        y = (x[:, 0] > 0).astype(np.float32)
        if skip_step(BATCH):
            computed.append(False)
            local.append(None)
        else:
            computed.append(True)
            if slow:
                time.sleep(sleep_s)
            with autograd.record():
                loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
            loss.backward()
            local.append({p.name: p.grad().asnumpy() for p in params})
            trainer.step(BATCH)
        applied.append({p.name: p.grad().asnumpy() for p in params})
    mx.nd.waitall()
    seconds = time.monotonic() - started
    with open(f"{out_dir}/rank{bps.rank()}.pkl", "wb") as out:
        pickle.dump({"initial": initial, "computed": computed, "local": local, "applied": applied,
                     "final": {p.name: p.data().asnumpy() for p in params}, "seconds": seconds}, out)
    print(f"backup rank {bps.rank()} computed {sum(computed)} of {steps} steps in {seconds:.2f} s", flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
