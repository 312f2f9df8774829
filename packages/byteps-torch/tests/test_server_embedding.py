"""ServerEmbedding under the real launcher: a table held by the servers, trained against torch's own
nn.Embedding and optimizers (scripts/server_embedding_checks.py; docs/sparse.md)."""

import os

import pytest

from byteps.testkit import assert_all_ok, launch_job, tail

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "server_embedding_checks.py")
CHECKS = ["sgd", "adagrad", "eval_on_one_rank", "save_and_load", "bad_ids"]
LAYOUTS = {
    "two-workers-two-servers": ["--workers", "2", "--servers", "2"],
    "two-machines-of-two": ["-np", "2", "--workers", "2", "--servers", "1"],  # the machine's rows summed first
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_server_embedding_trains_as_torchs_own_embedding(layout, tmp_path):
    args = LAYOUTS[layout]
    assert_all_ok(launch_job(args, SCRIPT, [str(tmp_path)], timeout=180), len(CHECKS), 4 if "-np" in args else 2)


def test_a_server_embedding_without_servers_says_what_to_add(tmp_path):
    result = launch_job(["-np", "2"], SCRIPT, [str(tmp_path)], timeout=120)
    assert result.returncode != 0
    assert "needs servers (bpslaunch --servers N" in result.stdout + result.stderr, tail(result.stdout)
