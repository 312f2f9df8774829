"""Asynchronous training of CUDA parameters, through the real staging, with a stand-in for the GPU only.

The jobs are real (scheduler, server, workers on 127.0.0.1); the stand-in
(byteps.testkit.device_stand_in) copies host memory where a GPU would copy
device memory. On a GPU machine the same path runs with CuPy
(benchmarks/gpu/verify_on_gpu.sh, docs/gpu.md).
"""

from __future__ import annotations

import os
import sys

import pytest

from byteps.testkit import run_job

WORKER = [sys.executable, os.path.join(os.path.dirname(__file__), "async_device_worker.py")]


@pytest.mark.parametrize("workers,local_size", [(2, 1), (2, 2)])
def test_every_delta_of_cuda_parameters_is_applied_once(workers, local_size):
    env = {"BYTEPS_ENABLE_ASYNC": "1", "BYTEPS_PARTITION_BYTES": "16384"}
    result = run_job(WORKER, workers, 1, local_size=local_size, env=env, timeout=90)
    assert not result.timed_out, "job timed out:\n" + result.failures()
    assert all(code == 0 for code in result.codes.values()), result.failures()
    for rank in range(workers * local_size):
        assert f"ASYNC DEVICE OK rank {rank}" in result.outputs[f"worker{rank}"], result.failures()
