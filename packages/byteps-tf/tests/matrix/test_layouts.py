"""TensorFlow's collectives and gradient wrappers in the layouts the default run leaves out
(docs/horovod-compatibility.md, "Layouts"): two machines of two processes (``-np 2 --workers 2
--servers 2``: 4 ranks, each machine's local sum through its root), and servers of their own
(``BYTEPS_ENABLE_IPC=0``: every payload over TCP, none through shared memory), with one process per
machine and with two.

The worker scripts are the default run's, every rank checking its results against numpy from every
rank's inputs: collectives_checks.py (allgather, alltoall, reducescatter, grouped ops, Min/Max/Product,
process sets, SyncBatchNormalization, join, the timeline), wrapper_checks.py (the tape, the Keras and
the TF1 DistributedOptimizer with process sets across machines, backward passes, scale factors, Adasum
over 4 ranks and a set) and keras_accumulation_checks.py (the Keras DistributedOptimizer's fit,
tf.function and eager loops against one process on the combined batch).
"""

from __future__ import annotations

import re

import pytest
from tf_jobs import SCRIPTS, launch_tf_job

from byteps.testkit import assert_all_ok, rank_lines, report

TWO_BY_TWO = ["-np", "2", "--workers", "2", "--servers", "2"]
#: name: (bpslaunch's layout, environment, ranks)
LAYOUTS = {
    "2x2": (TWO_BY_TWO, {}, 4),
    "2x2-servers-of-their-own": (TWO_BY_TWO, {"BYTEPS_ENABLE_IPC": "0"}, 4),
    "2x1-servers-of-their-own": (["--workers", "2", "--servers", "2"], {"BYTEPS_ENABLE_IPC": "0"}, 2),
}


def assert_path(result, env) -> None:
    """With BYTEPS_ENABLE_IPC=0, bpslaunch's summary line counts no payload through shared memory."""
    if env.get("BYTEPS_ENABLE_IPC") == "0":
        summary = [line for line in result.stderr.splitlines() if line.startswith("bpslaunch: job done in ")]
        assert len(summary) == 1 and "shared memory" not in summary[0], report(result)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_collectives(layout, tmp_path):
    flags, env, ranks = LAYOUTS[layout]
    result = launch_tf_job(flags, f"{SCRIPTS}/collectives_checks.py", env={**env, "BYTEPS_TEST_TMP": str(tmp_path)},
                           timeout=420)
    assert_all_ok(result, checks=11, ranks=ranks)
    assert_path(result, env)


@pytest.mark.parametrize("layout", [name for name, (_, _, ranks) in LAYOUTS.items() if ranks == 4])
def test_gradient_wrappers(layout):
    flags, env, ranks = LAYOUTS[layout]
    result = launch_tf_job(flags, f"{SCRIPTS}/wrapper_checks.py", env=env, timeout=420)
    assert_all_ok(result, checks=8, ranks=ranks)
    assert_path(result, env)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_keras_backward_passes_match_one_process(layout, tmp_path):
    flags, env, ranks = LAYOUTS[layout]
    result = launch_tf_job(flags, f"{SCRIPTS}/keras_accumulation_checks.py",
                           env={**env, "BYTEPS_TEST_TMP": str(tmp_path)}, timeout=420)
    assert_all_ok(result, checks=12, ranks=ranks)
    assert_path(result, env)
    for rank in range(ranks):
        reports = [line for line in rank_lines(result.stdout, rank) if line.startswith("equivalence")]
        assert len(reports) == 12, report(result)
        for line in reports:
            assert float(re.search(r"largest difference (\S+)$", line).group(1)) < 1e-5, line
