"""BytePS's gradient compression on TensorFlow: ``compression_params`` through a real job, and bad input.

One job (2 workers, 1 server, BYTEPS_MIN_COMPRESS_BYTES=64) runs
scripts/compression_checks.py: a linear model trained a few SGD steps with
a decaying learning rate by the Keras ``DistributedOptimizer`` (model.fit),
``DistributedGradientTape`` (eager and in tf.function) and the TF1
``DistributedOptimizer``, each rank recording its local gradients and the
gradients the compressed round gave. The test replays the local gradients
through byteps.testkit.compression_reference (worker momentum, error
feedback and codec, the server's sum, error feedback and codec) and
requires the same gradients on both ranks, every step, to float32
tolerance. The kernel is compressed; the bias is below
BYTEPS_MIN_COMPRESS_BYTES and goes as it is, getting its Nesterov momentum
after the pull.
"""

from __future__ import annotations

import json
import re
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from tf_jobs import SCRIPTS, launch_tf_job

from byteps.testkit import assert_all_ok, free_port, report
from byteps.testkit.compression_reference import ReferenceJob, uncompressed_rounds

STEPS = 5
#: name: (compression_params, the optimizer's momentum); the name's start says how the script trains.
CASES = {
    "keras-fit-onebit-scaling-ef-nesterov": ({"compressor": "onebit", "scaling": True, "ef": "vanilla",
                                             "momentum": "nesterov"}, 0.9),
    "tape-eager-topk-fraction-ef": ({"compressor": "topk", "k": 0.1, "ef": "vanilla"}, 0.0),
    "tape-function-dithering-ef-nesterov": ({"compressor": "dithering", "k": 8, "seed": 11, "ef": "vanilla",
                                            "momentum": "nesterov"}, 0.5),
    "tf1-momentum-randomk-ef-nesterov": ({"compressor": "randomk", "k": 20, "seed": 7, "ef": "vanilla",
                                         "momentum": "nesterov"}, 0.9),
}


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """Every case's records of both ranks, from one job (TensorFlow's import dominates a job's cost)."""
    out = tmp_path_factory.mktemp("compression")
    result = launch_tf_job(["--workers", "2", "--servers", "1"], f"{SCRIPTS}/compression_checks.py",
                           [str(out), str(STEPS), json.dumps(CASES)],
                           env={"BYTEPS_MIN_COMPRESS_BYTES": "64", "MASTER_PORT": str(free_port())}, timeout=300)
    assert_all_ok(result, checks=len(CASES) + 1)  # and: compressed and small gradients fuse apart
    loaded = {case: [np.load(out / f"{case}.rank{rank}.npz") for rank in range(2)] for case in CASES}
    for ranks in loaded.values():
        assert all(len(r["lr"]) == STEPS for r in ranks), report(result)
    return loaded


@pytest.mark.parametrize("case", list(CASES))
def test_two_workers_match_the_reference_algorithm(case, records):
    params, mu = CASES[case]
    ranks = records[case]
    reference = ReferenceJob(params, workers=2, momentum=mu)
    bias = uncompressed_rounds([r["local_bias"] for r in ranks], mu)
    lrs = [float(ranks[0]["lr"][step]) for step in range(STEPS)]
    assert all(later < earlier for earlier, later in zip(lrs, lrs[1:])), lrs  # it decays: ef rescales
    for step in range(STEPS):
        assert float(ranks[1]["lr"][step]) == lrs[step]
        expected = reference.round("kernel", [r["local_kernel"][step] for r in ranks], lrs[step])
        for rank, record in enumerate(ranks):
            np.testing.assert_allclose(record["synced_kernel"][step], expected, rtol=1e-6, atol=1e-7,
                                       err_msg=f"{case}: kernel, step {step}, rank {rank}")
            np.testing.assert_allclose(record["synced_bias"][step], bias[step], rtol=1e-6, atol=1e-7,
                                       err_msg=f"{case}: bias, step {step}, rank {rank}")
    # Compression did something: the kernel's averaged gradient is not the plain average.
    plain = (ranks[0]["local_kernel"][-1] + ranks[1]["local_kernel"][-1]) / 2
    assert not np.allclose(ranks[0]["synced_kernel"][-1], plain, atol=1e-6)



@pytest.mark.parametrize("params, message", [
    ({"compressor": "twobit"}, "'twobit' is not one of"),
    ({"compressor": "onebit", "k": 3}, "'k'] does not apply"),
    ({"compressor": "topk"}, "'k'] is required"),
    ({"compressor": "onebit", "momentum": "nesterov"}, "optimizer's momentum, which is 0.0"),
])
def test_bad_compression_params_fail_at_the_call(bps, params, message):
    import byteps.keras as bps_keras

    for wrap in (bps.DistributedOptimizer, bps_keras.DistributedOptimizer):
        with pytest.raises(ValueError, match=re.escape(message)):
            wrap(keras.optimizers.SGD(0.1), compression_params=params)
    if "momentum" not in params:
        with pytest.raises(ValueError, match=re.escape(message)):
            bps.DistributedGradientTape(tf.GradientTape(), compression_params=params)


def test_nesterov_needs_an_optimizer_with_momentum(bps):
    nesterov = {"compressor": "onebit", "momentum": "nesterov"}
    with pytest.raises(ValueError, match=re.escape("pass optimizer=")):
        bps.DistributedGradientTape(tf.GradientTape(), compression_params=nesterov)
    with pytest.raises(ValueError, match=re.escape("optimizer's momentum, which is None")):
        bps.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), compression_params=nesterov)
    built = keras.optimizers.SGD(0.1, momentum=0.9)
    built.build([tf.Variable(tf.zeros([2]))])
    with pytest.raises(ValueError, match="before it builds its variables"):
        bps.DistributedGradientTape(tf.GradientTape(), optimizer=built, compression_params=nesterov)


def test_one_worker_applies_the_momentum_it_took_from_the_optimizer(bps):
    """Nothing is sent with one worker, but the optimizer's momentum is off: byteps applies it, eager and in a graph."""
    optimizer = bps.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.5), name="local.nesterov",
                                         compression_params={"compressor": "topk", "k": 1, "momentum": "nesterov",
                                                             "fp16": True})
    assert optimizer.momentum == 0.0 and optimizer._byteps_reducer.compression is bps.Compression.fp16
    variable = tf.Variable([1.0, -2.0])
    graph = tf.function(lambda g: optimizer._byteps_reducer.reduce([g])[0])
    buffer, expected = np.zeros(2, np.float32), []
    gradients = [np.array([0.5, 1.0], np.float32), np.array([-1.0, 0.25], np.float32),
                 np.array([2.0, 2.0], np.float32)]
    results = [optimizer._byteps_reducer.reduce([tf.constant(gradients[0])])[0], graph(tf.constant(gradients[1])),
               optimizer._byteps_reducer.reduce([tf.constant(gradients[2])])[0]]
    for gradient in gradients:
        buffer = np.float32(0.5) * (buffer + gradient)
        expected.append(gradient + buffer)
    for result, want in zip(results, expected):
        np.testing.assert_allclose(result.numpy(), want, rtol=1e-6)
    optimizer.apply([tf.constant([1.0, 1.0])], [variable])
    assert not optimizer.momentums  # the optimizer built no momentum of its own


def test_error_feedback_under_the_optimizers_own_momentum_warns_at_the_call(bps):
    from byteps.common.compression import FeedbackMomentumWarning

    feedback = {"compressor": "onebit", "ef": "vanilla"}
    with pytest.warns(FeedbackMomentumWarning, match="nesterov") as caught:
        bps.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), compression_params=feedback)
    assert caught[0].filename == __file__  # the user's line, not byteps'
    with pytest.warns(FeedbackMomentumWarning, match="BYTEPS_MIN_COMPRESS_BYTES"):
        bps.DistributedOptimizer(tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), compression_params=feedback)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FeedbackMomentumWarning)
        bps.DistributedOptimizer(keras.optimizers.SGD(0.1), compression_params=feedback)  # no momentum
        bps.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9),  # the compressor carries it
                                 compression_params={**feedback, "momentum": "nesterov"})
        bps.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9),  # no error feedback
                                 compression_params={"compressor": "onebit"})
