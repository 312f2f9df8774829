"""CUDA tensors through byteps.torch on a real GPU (docs/gpu.md); skipped, with the reason, without one.

The staging bookkeeping itself is also tested without a GPU, in
byteps-common's test_device_staging.py (a stand-in copies host memory).
"""

import os
import re
import sys

import pytest
import torch

from byteps.testkit import launch_job, one_process_adapter, rank_lines, run_job

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "..", "examples", "torch")
CHECKS = [sys.executable, os.path.join(HERE, "scripts", "cuda_checks.py")]
sys.path.insert(0, os.path.join(HERE, "scripts"))
from cuda_checks import CASES  # noqa: E402


def _why_not() -> str:
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "CuPy is not installed (pip install cupy-cuda12x or cupy-cuda13x)"
    return ""


pytestmark = pytest.mark.skipif(bool(_why_not()), reason=_why_not() or "GPU present")


def assert_ok(result):
    assert not result.timed_out, "job timed out:\n" + result.failures()
    assert all(code == 0 for code in result.codes.values()), result.failures()


@pytest.mark.parametrize("workers,servers,local_size,gpu_local", [
    (2, 1, 1, "1"), (2, 2, 1, "1"), (1, 1, 2, "1"), (1, 1, 2, "0"), (2, 1, 2, "1"), (1, 0, 3, "1")])
def test_cuda_tensors_sum_like_the_cpu_reference(workers, servers, local_size, gpu_local):
    """Processes share the GPU (local rank modulo the GPUs); small partitions pipeline the copies. With local
    peers, the tensors are summed on the GPU through CUDA IPC (all but bfloat16, and the allreduce and
    broadcast's: 7 tensors), or with BYTEPS_GPU_LOCAL_AGGREGATION=0 in host memory."""
    env = {"BYTEPS_PARTITION_BYTES": "65536", "BYTEPS_GPU_LOCAL_AGGREGATION": gpu_local,
           **({"BYTEPS_FORCE_DISTRIBUTED": "1"} if servers else {})}  # no servers: the machine's sum is all
    result = run_job(CHECKS + ["3"], workers, servers, local_size=local_size, env=env, timeout=240)
    assert_ok(result)
    on_gpu = 2 * len([case for case in CASES if case[1] != torch.bfloat16]) + 2 \
        if local_size > 1 and gpu_local == "1" else 0
    for rank in range(workers * local_size):
        assert f"CUDA OK rank {rank} of {workers * local_size}" in result.outputs[f"worker{rank}"]
        assert f"{on_gpu} summed on the GPU" in result.outputs[f"worker{rank}"], result.outputs[f"worker{rank}"]


def test_sync_batch_norm_on_the_gpu():
    script = [sys.executable, os.path.join(HERE, "scripts", "sync_batch_norm_checks.py"), "cuda"]
    result = run_job(script, 2, 1, timeout=240)
    assert_ok(result)
    for rank in range(2):
        assert f"SYNCBN OK rank {rank} of 2 on cuda:0" in result.outputs[f"worker{rank}"]


@pytest.mark.parametrize("layout", [["--workers", "2", "--servers", "1"], ["-np", "2", "--servers", "1"]],
                         ids=["2 machines", "2 processes on one machine (summed on the GPU)"])
def test_digits_trains_on_the_gpu(layout):
    result = launch_job(layout, os.path.join(EXAMPLES, "train_digits.py"), ["--device", "cuda"], timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    text = "\n".join(rank_lines(result.stdout, 0))
    assert "worker(s) on cuda:0" in text, text
    accuracy = float(re.search(r"held-out accuracy (\S+)", text).group(1))
    assert accuracy >= 0.9, text


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_tensor_on_another_gpu_is_named(monkeypatch):
    with one_process_adapter(monkeypatch, "byteps.torch") as bps:
        bps.push_pull(torch.ones(4, device="cuda:0"), name="first")
        with pytest.raises(ValueError, match=r"the tensor is on cuda:1, but this process drives cuda:0"):
            bps.push_pull(torch.ones(4, device="cuda:1"), name="second")


def test_a_grouped_call_refuses_mixed_devices(monkeypatch):
    with one_process_adapter(monkeypatch, "byteps.torch") as bps:
        with pytest.raises(ValueError, match=r"push_pull_group\('b'\): the tensor is on cpu but 'a' on cuda:0; one "
                                             r"grouped call takes tensors on one device"):
            bps.push_pull_group_async([torch.ones(4, device="cuda"), torch.ones(4)], names=["a", "b"])
