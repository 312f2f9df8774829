"""The torch examples run under the real launcher, as their docstrings say."""

import os
import re

import pytest

from byteps.testkit import launch_job, rank_lines

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples", "torch")

pytestmark = pytest.mark.skipif(not os.path.isdir(EXAMPLES), reason="the repository's examples/ folder is not here")


def test_digits_trains_above_90_percent():
    result = launch_job(["--workers", "2", "--servers", "1"], os.path.join(EXAMPLES, "train_digits.py"), timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    lines = rank_lines(result.stdout, 0)
    assert sum(line.startswith("epoch") for line in lines) == 10, lines
    accuracy = float(re.search(r"held-out accuracy (\S+)", "\n".join(lines)).group(1))
    assert accuracy > 0.9, lines
    assert not rank_lines(result.stdout, 1), "only rank 0 reports"


def test_digits_with_onebit_compression_and_error_feedback_trains_above_90_percent():
    params = '{"compressor": "onebit", "scaling": true, "ef": "vanilla"}'
    result = launch_job(["--workers", "2", "--servers", "1"], os.path.join(EXAMPLES, "train_digits.py"),
                        ["--compression", params], timeout=120)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    lines = rank_lines(result.stdout, 0)
    assert float(re.search(r"held-out accuracy (\S+)", "\n".join(lines)).group(1)) >= 0.9, lines


def test_synthetic_benchmark_reports_img_per_sec():
    args = ["--model", "resnet8", "--num-warmup-batches", "1", "--num-batches-per-iter", "2", "--num-iters", "2",
            "--fp16-pushpull"]
    result = launch_job(["-np", "2"], os.path.join(EXAMPLES, "synthetic_benchmark.py"), args, timeout=120)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    text = "\n".join(rank_lines(result.stdout, 0))
    assert re.search(r"Img/sec per worker: [\d.]+ \+-[\d.]+", text), text
    assert re.search(r"Total img/sec on 2 worker\(s\): [\d.]+ \+-[\d.]+", text), text
