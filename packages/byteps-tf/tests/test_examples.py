"""The TensorFlow example runs under the real launcher, as its docstring says."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from tf_jobs import TF_SETTINGS, launch_tf_job

from byteps.testkit import clean_env, rank_lines, report

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples", "tensorflow")

pytestmark = pytest.mark.skipif(not os.path.isdir(EXAMPLES), reason="the repository's examples/ folder is not here")


def test_keras_digits_trains_above_90_percent():
    result = launch_tf_job(["--workers", "2", "--servers", "1"], os.path.join(EXAMPLES, "train_digits_keras.py"))
    assert result.returncode == 0, report(result)
    lines = rank_lines(result.stdout, 0)
    assert sum(line.startswith("epoch") for line in lines) == 10, lines
    accuracy = float(re.search(r"held-out accuracy (\S+)", "\n".join(lines)).group(1))
    assert accuracy > 0.9, lines
    assert not [line for line in rank_lines(result.stdout, 1) if line.startswith(("epoch", "held-out"))], \
        "only rank 0 reports"


def test_keras_digits_exits_non_zero_below_the_bar():
    # One worker without the launcher (byteps needs no server then): the exit code is the example's own.
    script = os.path.join(EXAMPLES, "train_digits_keras.py")
    result = subprocess.run([sys.executable, script, "--epochs", "1", "--min-accuracy", "1.01"],
                            env=clean_env(TF_SETTINGS), capture_output=True, text=True, timeout=180)
    assert result.returncode == 1, report(result)
    assert "is below --min-accuracy 1.01" in result.stderr, report(result)
