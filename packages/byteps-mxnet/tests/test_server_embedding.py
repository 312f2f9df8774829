"""ServerEmbedding under the real launcher: a table held by the servers and a gluon Dense layer trained against a
single-process numpy reference of SGD and Adagrad over every rank's gradients (scripts/server_embedding_checks.py;
docs/sparse.md, "Tables held by the servers")."""

from __future__ import annotations

import os

import pytest
from mxnet_jobs import launch_mxnet_job

from byteps.testkit import assert_all_ok, tail

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "server_embedding_checks.py")
CHECKS = ["sgd", "adagrad", "eval_on_one_rank", "save_and_load", "bad_ids"]
LAYOUTS = {
    "two-workers-two-servers": (["--workers", "2", "--servers", "2"], 2),
    "two-machines-of-two": (["-np", "2", "--workers", "2", "--servers", "1"], 4),  # the machine's rows summed first
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_server_embedding_trains_as_the_numpy_reference(layout, tmp_path):
    flags, ranks = LAYOUTS[layout]
    assert_all_ok(launch_mxnet_job(flags, SCRIPT, [str(tmp_path)], timeout=180), len(CHECKS), ranks)


def test_a_server_embedding_without_servers_says_what_to_add(tmp_path):
    result = launch_mxnet_job(["-np", "2"], SCRIPT, [str(tmp_path)], timeout=120)
    assert result.returncode != 0
    assert "needs servers (bpslaunch --servers N" in result.stdout + result.stderr, tail(result.stdout)
