"""``tf.IndexedSlices`` gradients under the real launcher: the row-sparse path through servers and on one
machine (docs/sparse.md; 2 machines of 2 processes: tests/matrix/test_sparse_layouts.py).

scripts/sparse_training_checks.py trains an embedding table with a dense
layer on top through DistributedGradientTape (eagerly, and in
``tf.function`` with ``op=Sum``), the Keras DistributedOptimizer and the
TF1 DistributedOptimizer (eagerly, or in a Session with eager execution
disabled), compares every step with a single-process reference on every
rank's batches, and checks which path the embedding's gradient took.
"""

import pytest
from tf_jobs import SCRIPTS, launch_tf_job

from byteps.testkit import assert_all_ok

SCRIPT = f"{SCRIPTS}/sparse_training_checks.py"
LAYOUTS = {
    "two-workers-one-server": (["--workers", "2", "--servers", "1"], "row-sparse"),
    "one-machine-np2": (["-np", "2"], "row-sparse"),   # several processes per machine, no servers: summed there
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_sparse_training_matches_the_reference(layout):
    args, path = LAYOUTS[layout]
    assert_all_ok(launch_tf_job(args, SCRIPT, [path]), checks=6)


def test_keras_2_sparse_training_goes_row_sparse():
    # TF_USE_LEGACY_KERAS=1: the Keras 2 optimizer wrapper, its Embedding layer and SGD.
    args, path = LAYOUTS["two-workers-one-server"]
    assert_all_ok(launch_tf_job(args, SCRIPT, [path], env={"TF_USE_LEGACY_KERAS": "1"}), checks=6)


def test_tf1_graph_sparse_training_goes_row_sparse():
    args, path = LAYOUTS["two-workers-one-server"]
    assert_all_ok(launch_tf_job(args, SCRIPT, [path, "graph"]), checks=1)
