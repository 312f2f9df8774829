"""Worker script: broadcast_parameters, DistributedTrainer and DistributedOptimizer.

Run under bpslaunch with 2 ranks. The equivalence checks train a small CNN
for 10 steps from per-rank random weights, each rank on its half of every
batch, and compare with the single-process run on whole batches that the
script does itself (plain gluon.Trainer, root's initial weights).
"""

from __future__ import annotations

import warnings

import mxnet as mx
import numpy as np
from check_runner import Checks, assert_array, expect_error
from mxnet import autograd, gluon
from mxnet.gluon import nn

import byteps.mxnet as bps

STEPS, BATCH, LR, MOMENTUM = 10, 32, 0.1, 0.9
checks = Checks()


def make_net(prefix: str, seed: int, deferred: bool = False) -> nn.HybridSequential:
    net = nn.HybridSequential(prefix=prefix)
    with net.name_scope():
        net.add(nn.Conv2D(8, 3, padding=1, in_channels=0 if deferred else 1, activation="relu"),
                nn.MaxPool2D(2), nn.Flatten(),
                nn.Dense(16, in_units=0 if deferred else 8 * 4 * 4, activation="relu"),
                nn.Dense(10, in_units=0 if deferred else 16))
    mx.random.seed(seed)
    net.initialize(mx.init.Xavier())
    return net


def full_batch(step: int):
    rng = np.random.RandomState(step)
    return (mx.nd.array(rng.uniform(0, 1, (BATCH, 1, 8, 8)).astype(np.float32)),
            mx.nd.array(rng.randint(0, 10, BATCH).astype(np.float32)))


def my_half(step: int):
    images, labels = full_batch(step)
    share = BATCH // bps.size()
    lo = bps.rank() * share
    return images[lo:lo + share], labels[lo:lo + share]


def train(net, trainer, batch_of) -> None:
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(STEPS):
        images, labels = batch_of(step)
        with autograd.record():
            loss = loss_fn(net(images), labels)
        loss.backward()
        trainer.step(images.shape[0])


def weights(net) -> dict:
    """Parameter values by name without the net's prefix."""
    return {name[len(net.prefix):]: p.data().asnumpy() for name, p in net.collect_params().items()}


def reference(deferred: bool = False) -> dict:
    net = make_net("reference_", seed=0, deferred=deferred)
    net.hybridize()
    train(net, gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR, "momentum": MOMENTUM}), full_batch)
    return weights(net)


def compare(net, expected: dict, what: str, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    worst = 0.0
    for name, got in weights(net).items():
        np.testing.assert_allclose(got, expected[name], rtol=rtol, atol=atol, err_msg=f"{what}: {name}")
        worst = max(worst, float(np.abs(got - expected[name]).max()))
    print(f"{what}: largest difference from the single-process reference {worst:.2e}", flush=True)


def main() -> None:
    bps.init()
    r, last = bps.rank(), bps.size() - 1
    expected = reference()
    expected_deferred = reference(deferred=True)

    def broadcast_dicts_in_any_order():
        keys = ["c", "a", "b"] if r == 0 else ["b", "c", "a"]  # insertion order differs between ranks
        mine = {k: mx.nd.ones((2, len(k) + i)) * (10 * r + i) for i, k in enumerate(sorted(keys))}
        params = {k: mine[k] for k in keys}
        bps.broadcast_parameters(params, root_rank=last)
        for i, k in enumerate(sorted(keys)):
            assert_array(params[k], np.full((2, len(k) + i), 10.0 * last + i, np.float32), f"dict entry {k}")
        net = make_net("bcast_", seed=100 + r)
        bps.broadcast_parameters(net.collect_params(), root_rank=0)
        root = weights(make_net("bcast_root_", seed=100))
        for name, value in weights(net).items():
            np.testing.assert_array_equal(value, root[name], err_msg=f"ParameterDict entry {name}")
        expect_error(ValueError, "invalid params", lambda: bps.broadcast_parameters([mx.nd.ones(2)]))

    def broadcast_deferred_parameters():
        net = make_net("deferred_", seed=200 + r, deferred=True)
        bps.broadcast_parameters(net.collect_params(), root_rank=0)  # shapes unknown yet: after the forward pass
        net(mx.nd.ones((1, 1, 8, 8)))
        for name, value in weights(net).items():
            root = bps.broadcast(mx.nd.array(value), root_rank=0, name=f"check.{name}").asnumpy()
            np.testing.assert_array_equal(value, root, err_msg=f"deferred parameter {name}")

    def trainer_equals_single_process():
        net = make_net("trainer_", seed=r)  # per-rank initial weights: the first step must broadcast the root's
        net.hybridize()
        params = list(net.collect_params().values())
        trainer = bps.DistributedTrainer(params if r == 0 else params[::-1], "sgd",
                                         {"learning_rate": LR, "momentum": MOMENTUM})
        train(net, trainer, my_half)
        compare(net, expected, "DistributedTrainer")

    def trainer_with_deferred_initialisation():
        net = make_net("trainer_deferred_", seed=r, deferred=True)  # shapes, and weights, come with the 1st forward
        net.hybridize()
        trainer = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": LR, "momentum": MOMENTUM})
        train(net, trainer, my_half)
        compare(net, expected_deferred, "DistributedTrainer, deferred initialisation")

    def first_step_broadcasts_later_changes():
        net = make_net("late_", seed=0)
        trainer = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.0}, root_rank=last)
        if r == last:  # e.g. a checkpoint loaded on the root after the trainer was built
            for param in net.collect_params().values():
                param.set_data(param.data() + 1)
        with autograd.record():
            loss = net(full_batch(0)[0]).sum()
        loss.backward()
        trainer.step(BATCH)
        original = weights(make_net("late_original_", seed=0))
        for name, value in weights(net).items():
            np.testing.assert_allclose(value, original[name] + 1, rtol=1e-6, err_msg=f"after the first step: {name}")

    def optimizer_equals_single_process():
        net = make_net("optimizer_", seed=r)
        bps.broadcast_parameters(net.collect_params(), root_rank=0)
        optimizer = bps.DistributedOptimizer(mx.optimizer.SGD(learning_rate=LR, momentum=MOMENTUM))
        train(net, gluon.Trainer(net.collect_params(), optimizer, kvstore=None), my_half)
        compare(net, expected, "gluon.Trainer with DistributedOptimizer")

    def predivide_and_fp16():
        net = make_net("predivide_", seed=r)
        trainer = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": LR, "momentum": MOMENTUM},
                                         gradient_predivide_factor=2.0)
        train(net, trainer, my_half)
        compare(net, expected, "DistributedTrainer with gradient_predivide_factor=2")
        results = []
        for prefix, label, kwargs in (("fp16a_", "compression=Compression.fp16", {"compression": bps.Compression.fp16}),
                                      ("fp16b_", "compression_params={'fp16': True}",
                                       {"compression_params": {"fp16": True}})):
            net = make_net(prefix, seed=r)
            trainer = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": LR, "momentum": MOMENTUM},
                                             **kwargs)
            train(net, trainer, my_half)
            compare(net, expected, f"DistributedTrainer with {label}", rtol=1e-2, atol=1e-3)
            results.append(weights(net))
        for name, value in results[0].items():
            np.testing.assert_array_equal(value, results[1][name], err_msg=f"both fp16 spellings: {name}")

    def trainer_options():
        params = make_net("options_", seed=0).collect_params()
        expect_error(NotImplementedError, "kvstore compression", lambda: bps.DistributedTrainer(
            params, "sgd", compression_params={"type": "2bit"}))
        expect_error(ValueError, "root_rank", lambda: bps.DistributedTrainer(params, "sgd", root_rank=5))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = bps.DistributedTrainer(params, bps.DistributedOptimizer(mx.optimizer.SGD()))
        assert not isinstance(trainer.optimizer, bps.DistributedOptimizer)
        assert any("unwrapped" in str(w.message) for w in caught), [str(w.message) for w in caught]

    checks.run("broadcast_parameters: dicts in any order, ParameterDicts", broadcast_dicts_in_any_order)
    checks.run("broadcast_parameters: deferred initialisation", broadcast_deferred_parameters)
    checks.run("DistributedTrainer equals one process on whole batches", trainer_equals_single_process)
    checks.run("DistributedTrainer with deferred initialisation equals one process",
               trainer_with_deferred_initialisation)
    checks.run("DistributedTrainer's first step broadcasts the root's current weights",
               first_step_broadcasts_later_changes)
    checks.run("DistributedOptimizer equals one process on whole batches", optimizer_equals_single_process)
    checks.run("gradient_predivide_factor and fp16 compression", predivide_and_fp16)
    checks.run("DistributedTrainer options", trainer_options)
    mx.nd.waitall()
    bps.shutdown()
    checks.done()


if __name__ == "__main__":
    main()
