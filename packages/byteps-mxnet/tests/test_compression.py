"""BytePS's compression_params on DistributedTrainer and DistributedOptimizer: a real job, and one process.

The job (2 workers, 1 server; scripts/compression_checks.py) records each
rank's local gradients and the gradients each SGD step used; the test
replays the local gradients, divided by the batch size first as in
BytePS's trainer (the optimizer's rescale_grad is then 1), through
byteps.testkit.compression_reference
(worker momentum, error feedback and codec, server sum, server error
feedback and codec) and requires those gradients on both ranks, every
step, to float32 tolerance, with a learning rate that changes every step.
The weight (800 bytes) is compressed; the bias (20 bytes) is below
BYTEPS_MIN_COMPRESS_BYTES=64 and goes as it is, then gets its Nesterov
momentum after the pull. The onebit case with ``wd`` adds BytePS's
weight-decay momentum to both.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from mxnet_jobs import launch_mxnet_job

from byteps.testkit import assert_all_ok
from byteps.testkit.compression_reference import ReferenceJob

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
STEPS, BATCH = 5, 8
#: case -> (compression_params as the reference reads them, momentum factor, weight decay)
CASES = {
    "onebit-scaling-ef-nesterov": ({"compressor": "onebit", "scaling": True, "ef": "vanilla",
                                    "momentum": "nesterov"}, 0.9, 0.0),
    "randomk-seeded-ef": ({"compressor": "randomk", "k": 20, "seed": 7, "ef": "vanilla"}, 0.0, 0.0),
    "topk-fraction-ef-nesterov": ({"compressor": "topk", "k": 0.1, "ef": "vanilla", "momentum": "nesterov"},
                                  0.9, 0.0),
    "dithering-seeded": ({"compressor": "dithering", "k": 8, "seed": 11}, 0.0, 0.0),
    "dithering-natural-ef-nesterov-optimizer": ({"compressor": "dithering", "k": 4, "partition": "natural",
                                                 "seed": 3, "ef": "vanilla", "momentum": "nesterov"}, 0.5, 0.0),
    "onebit-ef-nesterov-wd": ({"compressor": "onebit", "ef": "vanilla", "momentum": "nesterov"}, 0.9, 0.01),
    "onebit-plain": ({"compressor": "onebit"}, 0.0, 0.0),
}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Every case's records (one job runs them all), as {case: [rank0, rank1]}."""
    return record(tmp_path_factory.mktemp("compression"), ["--workers", "2", "--servers", "1"])


def record(out, layout, env=None):
    """Run compression_checks.py (2 workers) under ``layout``; every case's records, as {case: [rank0, rank1]}."""
    result = launch_mxnet_job(layout, os.path.join(SCRIPTS, "compression_checks.py"),
                              [str(out)], env={"BYTEPS_MIN_COMPRESS_BYTES": "64", **(env or {})}, timeout=180)
    assert_all_ok(result, checks=len(CASES) + 1)  # and: compressed and small gradients fuse apart
    return {case: [np.load(out / f"{case}.rank{rank}.npz") for rank in range(2)] for case in CASES}


def _with_weight_decay(gradient, weights, wd, mu, buffer):
    """BytePS's onebit WeightDecayMomentumAdapter: + (w + M), M = mu*(M + w)."""
    decay = (weights * np.float32(wd)).astype(np.float32)
    buffer[:] = (np.float32(mu) * (buffer + decay)).astype(np.float32)
    decay = (decay + buffer).astype(np.float32)
    return (gradient + decay).astype(np.float32)


def _per_sample(gradient):
    """A gradient divided by the batch size, as BytePS's trainer divides it before compression (exact: 8 = 2**3)."""
    return (gradient / np.float32(BATCH)).astype(np.float32)


def _expected(records, params, mu, wd):
    """Each step's weight and bias gradients, as the reference algorithm gives them."""
    job = ReferenceJob(params, workers=2, momentum=mu)
    nag = np.zeros_like(records[0]["local_bias"][0])
    wd_weight = np.zeros_like(records[0]["local_weight"][0])
    wd_bias = np.zeros_like(nag)
    for step in range(STEPS):
        lr = float(records[0]["lr"][step])
        weight = job.round("weight", [_per_sample(r["local_weight"][step]) for r in records], lr)
        bias = ((_per_sample(records[0]["local_bias"][step]) + _per_sample(records[1]["local_bias"][step]))
                / np.float32(2)).astype(np.float32)
        if mu:  # the uncompressed bias: BytePS's momentum after the pull
            nag = (np.float32(mu) * (nag + bias)).astype(np.float32)
            bias = (bias + nag).astype(np.float32)
        if wd:
            weight = _with_weight_decay(weight, records[0]["weight_before"][step], wd, mu, wd_weight)
            bias = _with_weight_decay(bias, records[0]["bias_before"][step], wd, mu, wd_bias)
        yield step, weight, bias


@pytest.mark.parametrize("case", list(CASES))
def test_two_workers_match_the_reference_algorithm(recorded, case):
    check_the_reference_algorithm(recorded[case], case)


def check_the_reference_algorithm(records, case):
    """Both ranks' records of ``case`` against byteps.testkit.compression_reference."""
    params, mu, wd = CASES[case]
    for step, weight, bias in _expected(records, params, mu, wd):
        for rank, record in enumerate(records):
            np.testing.assert_allclose(record["synced_weight"][step], weight, rtol=1e-6, atol=1e-6,
                                       err_msg=f"{case}: weight, step {step}, rank {rank}")
            np.testing.assert_allclose(record["synced_bias"][step], bias, rtol=1e-6, atol=1e-6,
                                       err_msg=f"{case}: bias, step {step}, rank {rank}")
    # Compression did something: the weight's gradient is not the plain average.
    plain = (_per_sample(records[0]["local_weight"][-1]) + _per_sample(records[1]["local_weight"][-1])) / 2
    assert not np.allclose(records[0]["synced_weight"][-1], plain, atol=1e-4)
    # Both ranks stepped with the same gradients from the root's weights.
    np.testing.assert_array_equal(records[0]["final_weight"], records[1]["final_weight"])
    np.testing.assert_array_equal(records[0]["final_bias"], records[1]["final_bias"])
    assert len(set(records[0]["lr"].tolist())) == STEPS  # error feedback saw the learning rate change


def _onebit(x):
    """BytePS's onebit without scaling, decoded: -1 where x < 0, else +1."""
    return np.where(x < 0, np.float32(-1), np.float32(1))


def test_onebit_without_scaling_steps_by_the_learning_rate_as_in_bytepss_trainer(recorded):
    check_onebit_without_scaling(recorded["onebit-plain"])


def check_onebit_without_scaling(records):
    """BytePS's test_onebit (scaling off) in numpy: w -= lr * C(sum_i C(g_i / (batch * workers))).

    The gradient is divided by the batch size before it is compressed, so
    the step is the learning rate itself; compressing first and dividing
    after (as byteps.mxnet once did) steps lr / batch.
    """
    for step in range(STEPS - 1):
        lr = np.float32(records[0]["lr"][step])
        pushed = [_onebit(r["local_weight"][step] / np.float32(BATCH * 2)) for r in records]
        expected = records[0]["weight_before"][step] - lr * _onebit(pushed[0] + pushed[1])
        for rank, record in enumerate(records):
            np.testing.assert_allclose(record["weight_before"][step + 1], expected, rtol=1e-6, atol=1e-7,
                                       err_msg=f"onebit without scaling: step {step}, rank {rank}")


# --- one process: no servers, so nothing is compressed and every gradient gets its momentum after the pull ---



def _dense(prefix):
    import mxnet as mx

    net = mx.gluon.nn.Dense(3, in_units=4, prefix=prefix)
    net.initialize(mx.init.One())
    return net


@pytest.mark.parametrize("params, kind, message", [
    ({"compressor": "fivebit"}, ValueError, "'fivebit'"),
    ({"compressor": "topk"}, ValueError, "compression_params['k'] is required"),
    ({"compressor": "onebit", "momentum": "nesterov"}, ValueError, "takes its factor from the optimizer's momentum"),
    ({"compressor": "onebit", "colour": "red"}, ValueError, "unknown key(s) ['colour']"),
    ({"type": "2bit"}, NotImplementedError, "kvstore compression"),
])
def test_bad_compression_params_fail_at_the_call(bps, params, kind, message):
    import mxnet as mx

    net = _dense("bad_")
    with pytest.raises(kind, match=re.escape(message)):
        bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, compression_params=params)
    with pytest.raises(kind, match=re.escape(message)):
        bps.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.1), compression_params=params)


def test_compression_refuses_predivide_and_a_compressing_distributed_optimizer(bps):
    import mxnet as mx

    net = _dense("refuse_")
    with pytest.raises(ValueError, match="gradient_predivide_factor must be 1.0"):
        bps.DistributedTrainer(net.collect_params(), "sgd", compression_params={"compressor": "onebit"},
                               gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="'fp16'] is DistributedTrainer's"):
        bps.DistributedOptimizer(mx.optimizer.SGD(), compression_params={"compressor": "onebit", "fp16": True})
    optimizer = bps.DistributedOptimizer(mx.optimizer.SGD(), compression_params={"compressor": "onebit"})
    with pytest.raises(ValueError, match="give compression_params to DistributedTrainer"):
        bps.DistributedTrainer(net.collect_params(), optimizer)


def test_nesterov_moves_the_momentum_out_of_the_optimizer_and_applies_it_after_the_pull(bps):
    import mxnet as mx

    net = _dense("one_")
    params = {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.5}
    trainer = bps.DistributedTrainer(net.collect_params(), "sgd", params,
                                     compression_params={"compressor": "topk", "k": 2, "momentum": "Nesterov"})
    assert params == {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.5}  # the caller's dict is left alone
    assert (trainer.optimizer.momentum, trainer.optimizer.wd) == (0.0, 0.5)  # wd moves out for onebit only
    x = mx.nd.ones((2, 4))
    buffer = np.zeros((3, 4), np.float32)
    for _ in range(3):
        with mx.autograd.record():
            loss = net(x).sum()
        loss.backward()
        local = net.weight.grad().asnumpy() / np.float32(2)  # divided by the batch size first, as in BytePS
        trainer.step(2)
        buffer = np.float32(0.9) * (buffer + local)
        np.testing.assert_allclose(net.weight.grad().asnumpy(), local + buffer, rtol=1e-6)

    optimizer = mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=0.5)
    bps.DistributedOptimizer(optimizer, compression_params={"compressor": "onebit", "momentum": "nesterov"})
    assert (optimizer.momentum, optimizer.wd) == (0.0, 0.0)


def test_onebit_weight_decay_comes_back_with_its_own_momentum_and_wd_mult(bps):
    import mxnet as mx

    net = _dense("wd_")
    net.bias.wd_mult = 0.0
    trainer = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.5, "wd": 0.1},
                                     compression_params={"compressor": "onebit", "momentum": "nesterov"})
    assert (trainer.optimizer.momentum, trainer.optimizer.wd) == (0.0, 0.0)
    x = mx.nd.ones((2, 4))
    nag = {"weight": np.zeros((3, 4), np.float32), "bias": np.zeros(3, np.float32)}
    decay_momentum = np.zeros((3, 4), np.float32)
    for _ in range(3):
        with mx.autograd.record():
            loss = net(x).sum()
        loss.backward()
        # divided by the batch size first, as in BytePS: the optimizer's rescale_grad is 1
        local = {key: getattr(net, key).grad().asnumpy() / np.float32(2) for key in ("weight", "bias")}
        before = net.weight.data().asnumpy()
        trainer.step(2)
        for key in nag:  # one process: nothing is compressed, Nesterov after the pull
            nag[key] = np.float32(0.5) * (nag[key] + local[key])
            local[key] = local[key] + nag[key]
        decay = np.float32(0.1) * before
        decay_momentum = np.float32(0.5) * (decay_momentum + decay)
        np.testing.assert_allclose(net.weight.grad().asnumpy(), local["weight"] + decay + decay_momentum,
                                   rtol=1e-6)
        np.testing.assert_allclose(net.bias.grad().asnumpy(), local["bias"], rtol=1e-6)  # wd_mult 0


@pytest.mark.parametrize("optimizer, optimizer_params, params, warns", [
    ("sgd", {"momentum": 0.9}, {"compressor": "onebit", "scaling": True, "ef": "vanilla"}, True),
    ("sgd", {"momentum": 0.9}, {"compressor": "randomk", "k": 3, "ef": "vanilla"}, True),
    ("signum", {}, {"compressor": "onebit", "ef": "vanilla"}, True),  # Signum's default momentum is 0.9
    ("sgd", {"momentum": 0.9}, {"compressor": "onebit", "ef": "vanilla", "momentum": "nesterov"}, False),
    ("sgd", {"momentum": 0.9}, {"compressor": "onebit", "scaling": True}, False),
    ("sgd", {}, {"compressor": "randomk", "k": 3, "ef": "vanilla"}, False),
])
def test_error_feedback_with_the_optimizers_momentum_warns_at_the_call(bps, optimizer, optimizer_params, params,
                                                                      warns):
    import warnings

    import mxnet as mx

    from byteps.common.compression import FeedbackMomentumWarning

    def ours(build):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            build()
            mx.nd.waitall()  # the trainer's broadcasts, before the fixture shuts byteps down
        found = [w for w in caught if issubclass(w.category, FeedbackMomentumWarning)]
        assert len(found) == (1 if warns else 0), [str(w.message) for w in caught]
        assert all(w.filename == __file__ and "nesterov" in str(w.message) for w in found)

    ours(lambda: bps.DistributedTrainer(_dense(f"warn_{optimizer}_").collect_params(), optimizer,
                                        dict(optimizer_params, learning_rate=0.1), compression_params=params))
    ours(lambda: bps.DistributedOptimizer(mx.optimizer.create(optimizer, learning_rate=0.1, **optimizer_params),
                                          compression_params=params))
