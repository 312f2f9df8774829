"""Sparse gradients under the real launcher: the row-sparse path through servers and on one machine,
Horovod's gather with BYTEPS_ROW_SPARSE=0 (docs/sparse.md).

scripts/sparse_training_checks.py trains an nn.Embedding / nn.EmbeddingBag
(sparse=True) with a dense layer on top through DistributedOptimizer (SGD,
Adagrad, SparseAdam, sparse_as_dense) and byteps' DistributedDataParallel,
calls sparse_allreduce_async, and
compares every step with a single-process reference on every rank's
batches; it checks which path was taken too. Gradients up to 4 KiB are
fused (BYTEPS_FUSION_MAX_TENSOR_BYTES), so the 32 KB table is sent alone;
with the default 64 KiB it is fused with the dense layer in the first step,
and leaves the bucket for the row-sparse path from the second on.
"""

import os

import pytest

from byteps.testkit import launch_job, rank_lines, tail

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "sparse_training_checks.py")
CHECKS = ["sgd", "adagrad_embedding_bag", "sparse_adam", "embedding_unused_on_one_rank", "sparse_as_dense",
          "sparse_allreduce_against_numpy", "ddp_sparse_embedding"]
LAYOUTS = {
    "two-workers-one-server": (["--workers", "2", "--servers", "1"], "row-sparse"),
    "two-workers-two-servers": (["--workers", "2", "--servers", "2"], "row-sparse"),
    "two-machines-of-two": (["-np", "2", "--workers", "2", "--servers", "2"], "row-sparse"),  # summed per machine
    "one-machine-np2": (["-np", "2"], "row-sparse"),   # several processes per machine, no servers: summed there
    "row-sparse-off": (["--workers", "2", "--servers", "1"], "gather"),   # BYTEPS_ROW_SPARSE=0
}
SMALL_FUSION = {"BYTEPS_FUSION_MAX_TENSOR_BYTES": "4096"}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_sparse_training_matches_the_reference(layout):
    args, path = LAYOUTS[layout]
    env = {**SMALL_FUSION, **({"BYTEPS_ROW_SPARSE": "0"} if layout == "row-sparse-off" else {})}
    _assert_passed(launch_job(args, SCRIPT, [path], env=env, timeout=180),
                   CHECKS + (["join_uneven_batches"] if path == "row-sparse" else []),
                   range(4) if "-np" in args and "--workers" in args else (0, 1))


def test_a_small_table_fused_in_its_first_step_goes_row_sparse_from_the_second():
    _assert_passed(launch_job(LAYOUTS["two-workers-two-servers"][0], SCRIPT, ["row-sparse", "fused"], timeout=180))


def _assert_passed(result, checks=CHECKS, ranks=(0, 1)):
    for rank in ranks:
        printed = rank_lines(result.stdout, rank)
        for check in checks:
            assert f"OK {check}" in printed, (
                f"rank {rank} did not pass {check!r} (exit {result.returncode}):\n"
                f"{tail(result.stdout)}\n--- stderr ---\n{tail(result.stderr)}")
    assert result.returncode == 0, tail(result.stdout) + tail(result.stderr)
