"""The mxnet example runs under the real launcher, as its docstring says."""

import os
import re

import pytest
from mxnet_jobs import launch_mxnet_job

from byteps.testkit import rank_lines

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples", "mxnet",
                       "train_digits.py")

pytestmark = pytest.mark.skipif(not os.path.isfile(EXAMPLE), reason="the repository's examples/ folder is not here")


def test_digits_trains_above_90_percent():
    result = launch_mxnet_job(["--workers", "2", "--servers", "1"], EXAMPLE, timeout=180)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    lines = rank_lines(result.stdout, 0)
    assert sum(line.startswith("epoch") for line in lines) == 10, lines
    accuracy = float(re.search(r"held-out accuracy (\S+)", "\n".join(lines)).group(1))
    assert accuracy > 0.9, lines
    assert not rank_lines(result.stdout, 1), "only rank 0 reports"


def test_digits_exits_non_zero_below_the_minimum_accuracy():
    result = launch_mxnet_job([], EXAMPLE, ["--epochs", "1", "--min-accuracy", "0.999"], timeout=120)
    assert result.returncode == 1, (result.stdout + result.stderr)[-4000:]
    assert "is below --min-accuracy 0.999" in result.stderr, result.stderr[-2000:]
