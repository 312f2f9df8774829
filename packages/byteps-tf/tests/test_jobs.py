"""Multi-worker jobs through the real bpslaunch (scheduler, servers, workers over TCP on 127.0.0.1).

Each job runs one worker script that checks many things on every rank
(TensorFlow's import dominates a job's cost, so checks are combined):

* scripts/ops_checks.py under both layouts: push_pull/allreduce of every
  dtype eagerly and in tf.function, default names, compression (fp16, bf16), gradients
  of the ops, broadcasts, broadcast_variables, allgather,
  DistributedGradientTape (dense and IndexedSlices), the TF1 optimizer, and
  errors, including ranks that disagree on a shape or dtype;
* scripts/collectives_checks.py under both layouts: allgather of any dtype,
  alltoall, reducescatter, grouped ops, Min/Max/Product, narrow integers,
  process sets, mismatches (FailedPreconditionError, also in graphs; the job usable after them) and
  SyncBatchNormalization against Keras on the whole batch, eagerly and in
  tf.function; the timeline (rank 0's Chrome trace);
* scripts/keras2_checks.py: the same for Keras 2 (tf_keras, TF_USE_LEGACY_KERAS=1), both of its optimizer
  families, SyncBatchNormalization as a Keras 2 layer, byteps.keras's ops, fp16/bf16 compression;
* scripts/keras2_graph_checks.py: Keras 2 in a TF1 graph (eager execution disabled), backward passes
  accumulated, against one process;
* scripts/tf1_graph_checks.py: the collectives in a TF1 graph run by a Session (Min/Max/Product,
  Adasum, gathers, alltoall, reducescatter, grouped, fp16/bf16, process sets, broadcast_variables,
  the timeline, join);
* scripts/keras_checks.py with two servers: equivalence of 2 workers on half
  batches with 1 process on whole batches, Keras model.fit with every
  callback, load_model, the Keras API, fp16/bf16 compression against a reference.
"""

from __future__ import annotations

import re

import pytest
from tf_jobs import SCRIPTS, launch_tf_job

from byteps.testkit import JOB_LAYOUTS, assert_all_ok, rank_lines, report


@pytest.mark.parametrize("layout", JOB_LAYOUTS)
def test_ops_under_bpslaunch(layout):
    result = launch_tf_job(JOB_LAYOUTS[layout], f"{SCRIPTS}/ops_checks.py")
    assert_all_ok(result, checks=14)
    local_size = 2 if layout == "one-machine-np2" else 1
    for rank in range(2):
        lines = rank_lines(result.stdout, rank)
        info = [line for line in lines if line.startswith("INFO")]
        assert info == [f"INFO rank={rank} size=2 local_rank={rank % local_size} local_size={local_size}"], info
        eager = next(line for line in lines if line.startswith("MISMATCH eager"))
        assert "shape 4, 16 bytes of float32" in eager and "shape 2x2, 16 bytes of float32" in eager, eager
        graph = next(line for line in lines if line.startswith("MISMATCH tf.function"))
        assert "of int32" in graph and "of float32" in graph, graph


def test_keras_under_bpslaunch(tmp_path):
    layout = JOB_LAYOUTS["two-machines-two-servers"]
    result = launch_tf_job(layout, f"{SCRIPTS}/keras_checks.py", env={"BYTEPS_TEST_TMP": str(tmp_path)})
    assert_all_ok(result, checks=9)
    for rank in range(2):
        reports = [line for line in rank_lines(result.stdout, rank) if line.startswith("equivalence")]
        assert len(reports) == 3, report(result)
        for line in reports:
            difference = float(re.search(r"reference (\S+)$", line).group(1))
            assert difference < 1e-5, line


def test_keras_2_under_bpslaunch():
    # TF_USE_LEGACY_KERAS=1: tf.keras is Keras 2 (tf_keras), and byteps wraps its optimizers, layers and callbacks.
    result = launch_tf_job(JOB_LAYOUTS["one-machine-np2"], f"{SCRIPTS}/keras2_checks.py",
                           env={"TF_USE_LEGACY_KERAS": "1"})
    assert_all_ok(result, checks=14)
    for rank in range(2):
        reports = [line for line in rank_lines(result.stdout, rank) if line.startswith("equivalence")]
        assert len(reports) == 6, report(result)
        for line in reports:
            assert float(re.search(r"reference (\S+)$", line).group(1)) < 1e-5, line


def test_keras_2_in_a_tf1_graph_under_bpslaunch():
    # Eager execution disabled: Keras 2's graph loop runs only what the fetched update depends on.
    result = launch_tf_job(JOB_LAYOUTS["one-machine-np2"], f"{SCRIPTS}/keras2_graph_checks.py",
                           env={"TF_USE_LEGACY_KERAS": "1"})
    assert_all_ok(result, checks=1)


def test_tf1_graph_collectives_under_bpslaunch(tmp_path):
    # Eager execution disabled: every collective a graph op run by a tf.compat.v1.Session.
    result = launch_tf_job(JOB_LAYOUTS["one-machine-np2"], f"{SCRIPTS}/tf1_graph_checks.py",
                           env={"BYTEPS_TEST_TMP": str(tmp_path)})
    assert_all_ok(result, checks=6)


@pytest.mark.parametrize("layout", JOB_LAYOUTS)
def test_collectives_under_bpslaunch(layout, tmp_path):
    result = launch_tf_job(JOB_LAYOUTS[layout], f"{SCRIPTS}/collectives_checks.py",
                           env={"BYTEPS_TEST_TMP": str(tmp_path)})
    assert_all_ok(result, checks=11)
