"""DistributedTrainer with row_sparse gradients (``gluon.nn.Embedding(sparse_grad=True)``) in real jobs: row-sparse
through the servers and on one machine, a dense average with BYTEPS_ROW_SPARSE=0 (docs/sparse.md).
scripts/sparse_training_checks.py compares every rank's weights with a single-process run that averages every rank's
gradients itself.
"""

from __future__ import annotations

import os

import pytest
from mxnet_jobs import launch_mxnet_job

from byteps.testkit import assert_all_ok

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "sparse_training_checks.py")
LAYOUTS = {
    "two-workers-two-servers": (["--workers", "2", "--servers", "2"], "row-sparse", 2),
    "two-machines-of-two": (["-np", "2", "--workers", "2", "--servers", "2"], "row-sparse", 4),
    "one-machine-np2": (["-np", "2"], "row-sparse", 2),  # one machine's processes sum by id among themselves
    "row-sparse-off": (["--workers", "2", "--servers", "1"], "dense", 2),  # BYTEPS_ROW_SPARSE=0
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sparse_gradients_match_the_reference(layout):
    flags, mode, ranks = LAYOUTS[layout]
    env = {"BYTEPS_ROW_SPARSE": "0"} if layout == "row-sparse-off" else None
    assert_all_ok(launch_mxnet_job(flags, SCRIPT, [mode], env=env), checks=3, ranks=ranks)
