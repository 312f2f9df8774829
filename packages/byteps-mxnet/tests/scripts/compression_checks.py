"""Worker script: compression_params on DistributedTrainer and DistributedOptimizer, recorded per rank.

Usage (2 workers, 1 server, BYTEPS_MIN_COMPRESS_BYTES=64): compression_checks.py OUT_DIR

Each case trains a Dense(5, in_units=40) layer (weight: 200 floats, 800
bytes, compressed; bias: 5 floats, 20 bytes, sent as it is) for STEPS SGD
steps on this rank's own data, the learning rate decaying every step, and
saves OUT_DIR/<case>.rank<r>.npz: each step's local gradients (what
backward wrote here), the gradients the step used (after the compressed
round and the momentum byteps owes), the learning rate pushed with, the
weights before the step, and the final weights. test_compression.py
replays the local gradients, divided by the batch size first as BytePS's
trainer divides them, through byteps.testkit.compression_reference.
"""

from __future__ import annotations

import os
import sys

import mxnet as mx
import numpy as np
from check_runner import Checks
from mxnet import autograd, gluon

import byteps.mxnet as bps

STEPS, BATCH, LR, DECAY = 5, 8, 0.1, 0.8

#: case -> (compression_params, optimizer_params, through DistributedOptimizer?)
CASES = {
    "onebit-scaling-ef-nesterov": ({"compressor": "onebit", "scaling": True, "ef": "vanilla",
                                    "momentum": "nesterov"}, {"momentum": 0.9}, False),
    "randomk-seeded-ef": ({"compressor": "randomk", "k": 20, "seed": 7, "ef": "vanilla"}, {}, False),
    "topk-fraction-ef-nesterov": ({"compressor": "topk", "k": 0.1, "ef": "vanilla", "momentum": "nesterov"},
                                  {"momentum": 0.9}, False),
    "dithering-seeded": ({"compressor": "dithering", "k": 8, "seed": 11}, {}, False),
    "dithering-natural-ef-nesterov-optimizer": ({"compressor": "dithering", "k": 4, "partition": "natural",
                                                 "seed": 3, "ef": "vanilla", "momentum": "nesterov"},
                                                {"momentum": 0.5}, True),
    "onebit-ef-nesterov-wd": ({"compressor": "ONEBIT", "ef": "Vanilla", "momentum": "nesterov"},
                              {"momentum": 0.9, "wd": 0.01}, False),
    "onebit-plain": ({"compressor": "onebit"}, {}, False),
}


def run_case(case: str, out_dir: str) -> None:
    compression_params, extra, through_optimizer = CASES[case]
    optimizer_params = {"learning_rate": LR, **extra}
    net = gluon.nn.Dense(5, in_units=40, prefix=case.replace("-", "_") + "_")
    mx.random.seed(1 + bps.rank())  # different weights per rank: the root's are broadcast
    net.initialize(mx.init.Xavier())
    if through_optimizer:
        bps.broadcast_parameters(net.collect_params(), root_rank=0)
        optimizer = bps.DistributedOptimizer(mx.optimizer.SGD(**optimizer_params),
                                             compression_params=compression_params)
        trainer = gluon.Trainer(net.collect_params(), optimizer, kvstore=None)
    else:
        given = dict(optimizer_params)
        trainer = bps.DistributedTrainer(net.collect_params(), "sgd", optimizer_params,
                                         compression_params=compression_params)
        assert optimizer_params == given, "the caller's optimizer_params changed"
    assert trainer.optimizer.momentum == 0.0, trainer.optimizer.momentum
    assert trainer.optimizer.wd == (0.0 if "wd" in extra else optimizer_params.get("wd", 0.0))
    data = np.random.RandomState(100 + bps.rank())
    loss_fn = gluon.loss.L2Loss()
    weight, bias = net.weight, net.bias
    record = {key: [] for key in ("local_weight", "local_bias", "synced_weight", "synced_bias", "lr",
                                  "weight_before", "bias_before")}
    for _ in range(STEPS):
        x = mx.nd.array(data.normal(size=(BATCH, 40)).astype(np.float32))
        y = mx.nd.array(data.normal(size=(BATCH, 5)).astype(np.float32))
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        record["local_weight"].append(weight.grad().asnumpy())
        record["local_bias"].append(bias.grad().asnumpy())
        record["weight_before"].append(weight.data().asnumpy())
        record["bias_before"].append(bias.data().asnumpy())
        record["lr"].append(trainer.learning_rate)
        trainer.step(BATCH)
        record["synced_weight"].append(weight.grad().asnumpy())  # SGD reads the gradient, leaves it
        record["synced_bias"].append(bias.grad().asnumpy())
        trainer.set_learning_rate(trainer.learning_rate * DECAY)
    np.savez(os.path.join(out_dir, f"{case}.rank{bps.rank()}.npz"),
             final_weight=weight.data().asnumpy(), final_bias=bias.data().asnumpy(),
             **{key: np.array(value) for key, value in record.items()})


def small_gradients_fuse() -> None:
    """DistributedTrainer with compression_params: the two compressed weights share a bucket, each compressed
    alone (onebit: one scale per weight); the two biases, too small to compress, share another (plain averages)."""
    from byteps.common import api
    from byteps.common.fusion import BUCKET_PREFIX

    net = gluon.nn.HybridSequential(prefix="fusion_")
    with net.name_scope():  # weights 1920 and 96 bytes (compressed), biases 48 and 8 (not)
        net.add(gluon.nn.Dense(12, in_units=40), gluon.nn.Dense(2, in_units=12))
    mx.random.seed(1 + bps.rank())
    net.initialize(mx.init.Xavier())
    trainer = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": LR},
                                     compression_params={"compressor": "onebit", "scaling": True})
    x = mx.nd.array(np.random.RandomState(bps.rank()).normal(size=(BATCH, 40)).astype(np.float32))
    with autograd.record():
        loss = net(x).sum()
    loss.backward()
    params = list(net.collect_params().values())
    local = {p.name: p.grad().asnumpy() for p in params}
    before = {name for name in api.worker().registry.tensor_ids if name.startswith(BUCKET_PREFIX)}
    trainer.allreduce_grads()
    mx.nd.waitall()
    buckets = {name for name in api.worker().registry.tensor_ids if name.startswith(BUCKET_PREFIX)} - before
    assert len(buckets) == 2, buckets
    scales = []
    for index, p in enumerate(params):
        if p.grad().size * 4 >= 64:  # compressed alone inside its bucket: one scale of its own
            scales.append(np.unique(np.abs(p.grad().asnumpy())))
            continue
        expected = bps.allreduce(mx.nd.array(local[p.name]), average=True, name=f"fusion.check.{index}")
        np.testing.assert_allclose(p.grad().asnumpy(), expected.asnumpy(), rtol=1e-6)
    assert [len(s) for s in scales] == [1, 1] and scales[0][0] != scales[1][0], scales


def main() -> None:
    out_dir = sys.argv[1]
    bps.init()
    checks = Checks()
    for case in CASES:
        checks.run(f"{case}: recorded", lambda case=case: run_case(case, out_dir))
    checks.run("compressed and small gradients fuse apart", small_gradients_fuse)
    mx.nd.waitall()
    bps.shutdown()
    checks.done()


if __name__ == "__main__":
    main()
