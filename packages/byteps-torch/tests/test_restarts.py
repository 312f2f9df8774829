"""A job restarted by bpslaunch --max-restarts resumes from its checkpoint and ends where an undisturbed one does."""

import json
import os
import re

import pytest

from byteps.testkit import launch_job, rank_lines

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "scripts", "restart_training.py")
EXAMPLES = os.path.join(HERE, "..", "..", "..", "examples", "torch")
LAYOUT = ["--workers", "2", "--servers", "1"]


def weights(result):
    line = next(line for line in rank_lines(result.stdout, 0) if line.startswith("WEIGHTS "))
    return json.loads(line[len("WEIGHTS "):])


@pytest.mark.parametrize("held", [[], ["held"]], ids=["model", "model-and-server-held-table"])
def test_a_restarted_job_ends_with_the_weights_of_an_undisturbed_one(tmp_path, held):
    # "held": a ServerEmbedding's rows live on the servers, which the restart replaces: the checkpoint has the
    # servers save them and load_checkpoint has the new servers load them (else the table would start over).
    undisturbed = launch_job(LAYOUT, SCRIPT, [str(tmp_path / "a"), "-1", *held], timeout=120)
    assert undisturbed.returncode == 0, (undisturbed.stdout + undisturbed.stderr)[-4000:]
    restarted = launch_job([*LAYOUT, "--max-restarts", "1"], SCRIPT, [str(tmp_path / "b"), "7", *held], timeout=180)
    output = restarted.stdout + restarted.stderr
    assert restarted.returncode == 0, output[-4000:]
    assert "attempt 1 of 2 failed (worker 1 (local rank 0) exited with code 5" in restarted.stderr, output[-4000:]
    starts = [line for line in rank_lines(restarted.stdout, 0) if line.startswith("START")]
    assert starts[0] == "START 1 attempt 0" and len(starts) == 2, starts
    resumed_at = int(re.match(r"START (\d+) attempt 1", starts[1]).group(1))
    assert resumed_at in (7, 8), starts  # after the last checkpoint rank 0 wrote before it was stopped
    assert weights(restarted) == pytest.approx(weights(undisturbed), rel=1e-6, abs=1e-7)
    if held:  # one save of the tables is kept: the one the last checkpoint names
        assert len(os.listdir(tmp_path / "b" / "held-tables")) == 1


def test_no_checkpoint_means_a_fresh_start_and_nothing_written_elsewhere(tmp_path):
    result = launch_job(LAYOUT, SCRIPT, [str(tmp_path / "c"), "-1"], timeout=120)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "START 1 attempt 0" in rank_lines(result.stdout, 0)
    assert os.listdir(tmp_path / "c") == ["checkpoint"]  # one file, no temporary left behind


@pytest.mark.skipif(not os.path.isdir(EXAMPLES), reason="the repository's examples/ folder is not here")
def test_digits_example_resumes_from_its_checkpoint(tmp_path):
    args = ["--epochs", "3", "--checkpoint-dir", str(tmp_path), "--min-accuracy", "0.5"]
    first = launch_job(LAYOUT, os.path.join(EXAMPLES, "train_digits.py"), args, timeout=120)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    again = launch_job(LAYOUT, os.path.join(EXAMPLES, "train_digits.py"), [*args[:1], "5", *args[2:]], timeout=120)
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    lines = rank_lines(again.stdout, 0)
    assert any(line.startswith(f"resumed after epoch 3 from {tmp_path}") for line in lines), lines
    epochs = [line.split(":")[0] for line in lines if line.startswith("epoch")]
    assert epochs == ["epoch  4", "epoch  5"], lines
    assert float(re.search(r"held-out accuracy (\S+)", "\n".join(lines)).group(1)) > 0.85, lines


