"""Asynchronous training (BYTEPS_ENABLE_ASYNC=1) in MXNet on every rank: timing, exactly-once, the servers' store.

Usage: python async_training.py OUT_DIR STEPS SLOW_RANK SLEEP_S {trainer,optimizer}
Each rank trains a small gluon model on its own data with momentum SGD,
through bps.DistributedTrainer ("trainer") or a gluon Trainer with
kvstore=None over bps.DistributedOptimizer ("optimizer"); SLOW_RANK sleeps
SLEEP_S per step. Every delta the exchange pushes is recorded, and compared
with the delta a plain (one-process) momentum SGD makes from this worker's
own gradient. After the loop a barrier, then one exchange of a zero delta
returns the servers' store, holding every rank's every delta. Each rank
writes OUT_DIR/rank<r>.pkl: its parameters before the first step, the sum
of its deltas, the final store, the time of each completed step, its count
of pushes and the largest difference from the plain update.
"""

from __future__ import annotations

import pickle
import sys
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import byteps.mxnet as bps

LR, MOMENTUM, BATCH = 0.05, 0.5, 32


def main() -> None:
    out_dir, steps, slow_rank, sleep_s, mode = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                                float(sys.argv[4]), sys.argv[5])
    bps.init()
    mx.random.seed(1234 + bps.rank())  # different initial weights: the first exchange makes them rank 0's
    net = gluon.nn.Sequential(prefix="async_")
    with net.name_scope():
        net.add(gluon.nn.Dense(8, in_units=16, activation="tanh"), gluon.nn.Dense(2, in_units=8))
    net.initialize(mx.init.Xavier())
    params = sorted(net.collect_params().values(), key=lambda p: p.name)  # gluon's and the trainer's order
    sgd = {"learning_rate": LR, "momentum": MOMENTUM}
    if mode == "trainer":
        trainer = bps.DistributedTrainer(net.collect_params(), "sgd", sgd)
        exchange = trainer._async
        names = [p.name for p in params]
        copies = {p.name: p.list_data() for p in params}
    else:
        optimizer = bps.DistributedOptimizer(mx.optimizer.SGD(**sgd))
        trainer = gluon.Trainer(net.collect_params(), optimizer, kvstore=None)
        exchange = optimizer._async
        names = [f"Weight.{i}" for i in range(len(params))]  # the optimizer's index of each parameter
        copies = {f"Weight.{i}": [p.data()] for i, p in enumerate(params)}
    by_name = dict(zip(names, params))
    deltas, last, pushes = {}, {}, [0]
    record_deltas(exchange, names, deltas, last, pushes)

    initial = {name: p.data().asnumpy().astype(np.float64) for name, p in by_name.items()}
    momentum = {name: np.zeros(p.shape, np.float32) for name, p in by_name.items()}
    rng = np.random.RandomState(bps.rank())
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    worst, times, started = 0.0, [], time.monotonic()
    for step in range(steps):
        x = rng.randn(BATCH, 16).astype(np.float32)
        y = (x[:, 0] > 0).astype(np.float32)
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
        loss.backward()
        if step == 0 and mode == "trainer":  # the trainer broadcast rank 0's weights when it was built
            initial = {name: p.data().asnumpy().astype(np.float64) for name, p in by_name.items()}
        # A plain gluon Trainer's momentum SGD on this worker's own gradient, for the same batch.
        for name, p in by_name.items():
            momentum[name] = MOMENTUM * momentum[name] - LR * p.grad().asnumpy() / BATCH
        if bps.rank() == slow_rank:
            time.sleep(sleep_s)
        trainer.step(BATCH)
        for name in names:
            worst = max(worst, float(np.abs(last[name] - momentum[name]).max()))
        times.append(time.monotonic() - started)
        print(f"step {step + 1} done at {times[-1]:.2f} s", flush=True)
    bps.barrier()
    exchange.pull(copies)  # a zero delta: the servers' store, with every delta in it
    final = {name: p.data().asnumpy().astype(np.float64) for name, p in by_name.items()}
    assert exchange.names == names, (exchange.names, names)
    with open(f"{out_dir}/rank{bps.rank()}.pkl", "wb") as out:
        pickle.dump({"initial": initial, "deltas": deltas, "final": final, "times": times, "pushes": pushes[0],
                     "names": names, "worst": worst}, out)
    print(f"async rank {bps.rank()} OK, largest difference from a plain update {worst:.2e}", flush=True)
    mx.nd.waitall()
    bps.shutdown()


def record_deltas(exchange, names, deltas, last, pushes) -> None:
    """Wrap the subtraction exchanges use: every delta pushed is summed into ``deltas`` and counted.

    Every step exchanges every parameter, in the order of ``names``, so the
    n-th subtraction is the delta of ``names[n % len(names)]``.
    """
    subtract = exchange.ops.subtract

    def recording_subtract(after, before):
        delta = subtract(after, before)
        name = names[pushes[0] % len(names)]
        pushes[0] += 1
        last[name] = delta
        deltas[name] = deltas.get(name, 0) + delta.astype(np.float64)
        return delta

    exchange.ops = exchange.ops.__class__(exchange.ops.copy, recording_subtract, exchange.ops.zeros_like)


if __name__ == "__main__":
    main()
