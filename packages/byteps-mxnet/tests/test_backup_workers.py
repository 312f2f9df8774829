"""Backup workers in MXNet training (docs/async.md): a slow worker skips the rounds that closed without it.

Real jobs of 3 workers and 1 server under bpslaunch: scripts/backup_training.py
trains through DistributedTrainer or a gluon Trainer over DistributedOptimizer,
the last rank sleeping in every batch it computes. Checked against numpy:
every round's average is the mean of two workers' own gradients of that round
(b = 1 of 3), every rank stepped with the same averages, and the parameters
every rank ends with are momentum SGD from rank 0's start over those averages.
"""

from __future__ import annotations

import itertools
import os
import pickle

import numpy as np
import pytest
from mxnet_jobs import launch_mxnet_job

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "backup_training.py")
LAYOUT = ["--workers", "3", "--servers", "1"]
STEPS, SLEEP_S = 16, 0.25
LR, MOMENTUM, BATCH = 0.1, 0.9, 16  # the script's


def run(tmp_path, mode, env, layout=LAYOUT):
    result = launch_mxnet_job(layout, SCRIPT, [str(tmp_path), str(STEPS), str(SLEEP_S), mode], env=env,
                              timeout=180)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    ranks = []
    for rank in range(3):
        with open(tmp_path / f"rank{rank}.pkl", "rb") as saved:
            ranks.append(pickle.load(saved))
    return ranks


def momentum_sgd(initial, averages):
    """MXNet's SGD (momentum, wd 0) over the averaged gradients, with gluon's rescale 1 / BATCH."""
    weights = {name: value.astype(np.float64) for name, value in initial.items()}
    moments = {name: np.zeros_like(value) for name, value in weights.items()}
    for average in averages:
        for name in weights:
            moments[name] = MOMENTUM * moments[name] - LR * average[name].astype(np.float64) / BATCH
            weights[name] = weights[name] + moments[name]
    return weights


def mean_of_two_of_a_round(average, locals_of_round):
    """Whether ``average`` is the mean of the gradients of two of the workers that computed the round."""
    for first, second in itertools.combinations(locals_of_round, 2):
        if all(np.allclose(average[name], (first[name] + second[name]) / 2, rtol=1e-5, atol=1e-7)
               for name in average):
            return True
    return False


@pytest.mark.parametrize("mode", ["trainer", "optimizer"])
def test_the_slow_worker_skips_closed_rounds_and_every_replica_holds_the_rounds_averages(tmp_path, mode):
    check_the_slow_worker_skips_closed_rounds(tmp_path, mode, LAYOUT)


def check_the_slow_worker_skips_closed_rounds(tmp_path, mode, layout, env=None):
    """The job of backup_training.py (3 workers, b = 1) under ``layout``, checked in numpy."""
    ranks = run(tmp_path, mode, {"BYTEPS_BACKUP_WORKERS": "1", **(env or {})}, layout)
    fast, slow = ranks[:2], ranks[2]
    assert all(all(rank["computed"]) for rank in fast)
    # It computed only the rounds it could still join, so it did not take STEPS x SLEEP_S = 4 s.
    assert 1 <= sum(slow["computed"]) <= STEPS // 2, slow["computed"]
    assert slow["seconds"] < 0.6 * STEPS * SLEEP_S, slow["seconds"]
    for rank in ranks:  # the first step started from rank 0's parameters everywhere
        for name, value in rank["initial"].items():
            np.testing.assert_array_equal(value, ranks[0]["initial"][name], err_msg=name)
    for step in range(STEPS):
        applied = ranks[0]["applied"][step]
        for rank in ranks[1:]:  # the same averages, the slow one's pulled without a push when it skipped
            for name, value in rank["applied"][step].items():
                np.testing.assert_array_equal(value, applied[name], err_msg=f"step {step} {name}")
        computed = [rank["local"][step] for rank in ranks if rank["computed"][step]]
        assert mean_of_two_of_a_round(applied, computed), f"step {step}: not the mean of two workers' gradients"
    expected = momentum_sgd(ranks[0]["initial"], ranks[0]["applied"])
    for rank in ranks:
        for name, value in rank["final"].items():
            np.testing.assert_array_equal(value, ranks[0]["final"][name], err_msg=name)
            np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_without_backup_workers_nothing_is_skipped(tmp_path):
    ranks = run(tmp_path, "trainer", {})
    assert all(all(rank["computed"]) for rank in ranks)
    assert ranks[2]["seconds"] >= STEPS * SLEEP_S
    for step in range(STEPS):  # every round the mean of all three
        locals_of_round = [rank["local"][step] for rank in ranks]
        for name, value in ranks[0]["applied"][step].items():
            np.testing.assert_allclose(value, sum(g[name] for g in locals_of_round) / 3, rtol=1e-5, atol=1e-7)
    for name, value in ranks[2]["final"].items():
        np.testing.assert_array_equal(value, ranks[0]["final"][name], err_msg=name)


def small_net(mx):
    net = mx.gluon.nn.Dense(2, in_units=4)
    net.initialize()
    return net


def one_step(mx, net, trainer):
    with mx.autograd.record():
        loss = net(mx.nd.ones((3, 4))).sum()
    loss.backward()
    trainer.step(3)


def test_one_worker_never_skips(bps):
    import mxnet as mx

    net = small_net(mx)
    trainer = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    one_step(mx, net, trainer)
    assert trainer.skip_step(3) is False
    optimizer = bps.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.1))
    trainer = mx.gluon.Trainer(net.collect_params(), optimizer, kvstore=None)
    one_step(mx, net, trainer)
    assert optimizer.skip_step(trainer, 3) is False
    mx.nd.waitall()


def test_optimizer_skip_step_names_what_it_needs(bps):
    import mxnet as mx

    net = small_net(mx)
    optimizer = bps.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.1))
    trainer = mx.gluon.Trainer(net.collect_params(), optimizer, kvstore=None)
    with pytest.raises(ValueError, match="batch_size of the trainer's step"):
        optimizer.skip_step(trainer)
    other = mx.gluon.Trainer(net.collect_params(), "sgd", kvstore=None)
    with pytest.raises(ValueError, match="pass the gluon Trainer .* got Trainer that does not"):
        optimizer.skip_step(other, 3)
    distributed = bps.DistributedTrainer(net.collect_params(), "sgd")
    with pytest.raises(ValueError, match=r"call trainer.skip_step\(batch_size\)"):
        optimizer.skip_step(distributed, 3)
    mx.nd.waitall()  # the trainer's broadcast, before the fixture shuts byteps down
