"""The capability matrix's TF1 graph column (docs/horovod-compatibility.md): eager execution disabled, every step a
``tf.compat.v1.Session`` run, under the real bpslaunch.

One job (2 workers, 1 server, TF_USE_LEGACY_KERAS=1) runs scripts/tf1_graph_matrix_checks.py: BytePS's
``compression_params`` through the TF1 ``DistributedOptimizer`` (replayed here through
byteps.testkit.compression_reference, as test_compression.py does for eager TensorFlow), SyncBatchNormalization
as a Keras 2 layer, and ``broadcast_global_variables``, each checked against numpy.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from tf_jobs import SCRIPTS, launch_tf_job

from byteps.testkit import assert_all_ok, free_port
from byteps.testkit.compression_reference import ReferenceJob, uncompressed_rounds

STEPS = 5
#: name: (compression_params, the MomentumOptimizer's momentum)
CASES = {
    "tf1-graph-onebit-scaling-ef-nesterov": ({"compressor": "onebit", "scaling": True, "ef": "vanilla",
                                             "momentum": "nesterov"}, 0.9),
    "tf1-graph-topk-ef": ({"compressor": "topk", "k": 0.1, "ef": "vanilla"}, 0.0),
}


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("tf1_graph")
    result = launch_tf_job(["--workers", "2", "--servers", "1"], f"{SCRIPTS}/tf1_graph_matrix_checks.py",
                           [str(out), str(STEPS), json.dumps(CASES)],
                           env={"BYTEPS_MIN_COMPRESS_BYTES": "64", "TF_USE_LEGACY_KERAS": "1",
                                "MASTER_PORT": str(free_port())}, timeout=300)
    assert_all_ok(result, checks=len(CASES) + 2)
    return {case: [np.load(out / f"{case}.rank{rank}.npz") for rank in range(2)] for case in CASES}


def test_sync_batch_norm_and_broadcast_global_variables_in_a_tf1_graph(records):
    """The job's other checks (SyncBatchNormalization, broadcast_global_variables) passed on both ranks."""
    assert set(records) == set(CASES)


@pytest.mark.parametrize("case", list(CASES))
def test_compression_params_in_a_tf1_graph_match_the_reference_algorithm(case, records):
    params, mu = CASES[case]
    ranks = records[case]
    assert all(len(r["lr"]) == STEPS for r in ranks)
    reference = ReferenceJob(params, workers=2, momentum=mu)
    bias = uncompressed_rounds([r["local_bias"] for r in ranks], mu)
    for step in range(STEPS):
        lr = float(ranks[0]["lr"][step])
        expected = reference.round("kernel", [r["local_kernel"][step] for r in ranks], lr)
        for rank, record in enumerate(ranks):
            np.testing.assert_allclose(record["synced_kernel"][step], expected, rtol=1e-6, atol=1e-7,
                                       err_msg=f"{case}: kernel, step {step}, rank {rank}")
            np.testing.assert_allclose(record["synced_bias"][step], bias[step], rtol=1e-6, atol=1e-7,
                                       err_msg=f"{case}: bias, step {step}, rank {rank}")
    plain = (ranks[0]["local_kernel"][-1] + ranks[1]["local_kernel"][-1]) / 2
    assert not np.allclose(ranks[0]["synced_kernel"][-1], plain, atol=1e-6)


def test_skip_step_in_a_tf1_graph_needs_the_session(bps):
    """In a TF1 graph the skipped round's update is an op: without a session, a clear error at the call."""
    import tensorflow as tf

    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=tf.zeros([2]))
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * 2.0)
        bps.DistributedGradientTape(tape).gradient(loss, [w])
        with pytest.raises(ValueError, match=r"pass the Session that runs the training op \(session=...\)"):
            bps.skip_step(optimizer, [w])
        wrapped = bps.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
        wrapped.minimize(tf.reduce_sum(w * 3.0), var_list=[w])
        with pytest.raises(ValueError, match=r"DistributedOptimizer.skip_step\(\) in a TF1 graph"):
            wrapped.skip_step()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            assert wrapped.skip_step(session) is False  # one worker: never behind
            with session.as_default():
                assert bps.skip_step(optimizer, [w]) is False
