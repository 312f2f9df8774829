"""CUDA staging's bookkeeping on the CPU: routes, the copy waiter, pinned buffers, errors.

A stand-in for the GPU (byteps.testkit.device_stand_in) copies host memory
on a thread of its own; the jobs are real (scheduler, servers, workers on
127.0.0.1). This checks the bookkeeping, not CUDA: the GPU run is
packages/byteps-torch/tests/test_cuda.py, through benchmarks/gpu/verify_on_gpu.sh
(docs/gpu.md).
"""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from byteps.common.device_staging import DeviceStaging, device_of
from byteps.common.engine.route import Placement, Role, Stage, plan_route
from byteps.testkit import run_job

sys.path.insert(0, os.path.dirname(__file__))

WORKER = [sys.executable, os.path.join(os.path.dirname(__file__), "device_staging_worker.py")]


def assert_ok(result):
    assert not result.timed_out, "job timed out:\n" + result.failures()
    assert all(code == 0 for code in result.codes.values()), result.failures()


def test_a_cuda_route_starts_and_ends_on_the_device():
    for args in [(Role.ALONE, True), (Role.ROOT, True), (Role.PEER, True), (Role.ALONE, True, True),
                 (Role.ROOT, False)]:
        route = plan_route(*args, placement=Placement.STAGED).stages
        assert route[0] is Stage.DEVICE_TO_HOST and route[-1] is Stage.HOST_TO_DEVICE
        assert route[1:-1] == plan_route(*args).stages
    assert plan_route(Role.ALONE, True).stages == (Stage.EXCHANGE, Stage.COPY_OUT)


@pytest.mark.parametrize("workers,servers,local_size,delay,copy_bytes", [
    (2, 1, 1, "0.001", "32768"), (2, 2, 1, "0.001", "32768"), (1, 1, 2, "0.001", "32768"),
    (2, 1, 2, "0.001", "32768"),
    (2, 1, 1, "0", "1"),  # a copy per partition, done at once: the waiter reports many per message
])
def test_staged_tensors_sum_like_host_ones(workers, servers, local_size, delay, copy_bytes):
    """Small partitions, so each tensor is several copies each way (runs of 2 partitions, or one each),
    pipelined with the pushes."""
    env = {"BYTEPS_PARTITION_BYTES": "16384"}
    result = run_job(WORKER + ["4", delay, copy_bytes], workers, servers, local_size=local_size, env=env)
    assert_ok(result)
    for rank in range(workers * local_size):
        assert f"STAGED OK rank {rank} of {workers * local_size}: 4 rounds" in result.outputs[f"worker{rank}"]


def _partitions(partition_bytes):
    """Partitions per round of device_staging_worker.py's tensors."""
    from device_staging_worker import TENSORS
    sizes = [count * np.dtype(dtype).itemsize for _, dtype, count, _, _ in TENSORS]
    return sum(-(-nbytes // partition_bytes) for nbytes in sizes)


@pytest.mark.parametrize("workers,servers,local_size,gpu_local", [
    (1, 1, 2, "1"), (2, 1, 2, "1"), (2, 1, 2, "0"), (1, 0, 3, "1"), (1, 0, 3, "0")])
def test_local_peers_sum_on_the_device(workers, servers, local_size, gpu_local):
    """Local ranks (2 or 3, with servers or without): with BYTEPS_GPU_LOCAL_AGGREGATION (the default) every
    partition is summed once, on the "device", by its root, which alone copies it to the host and back; with 0,
    every rank copies its whole tensor each way and the host sums."""
    env = {"BYTEPS_PARTITION_BYTES": "16384", "BYTEPS_GPU_LOCAL_AGGREGATION": gpu_local}
    result = run_job(WORKER + ["4", "0.001", "32768"], workers, servers, local_size=local_size, env=env)
    assert_ok(result)
    sums = [int(re.search(r"(\d+) sums on the device", result.outputs[f"worker{rank}"]).group(1))
            for rank in range(local_size * workers)]
    if gpu_local == "1":
        per_machine = [sum(sums[m * local_size:(m + 1) * local_size]) for m in range(workers)]
        assert per_machine == [4 * _partitions(16384)] * workers, sums
        assert all(sums), sums  # the roots are spread over the local ranks
    else:
        assert sums == [0] * (local_size * workers)


def test_a_single_process_copies_through():
    """One worker process, no scheduler: the result is the input, copied on the device when out of place."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_"))}
    done = subprocess.run(WORKER + ["2"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "STAGED OK rank 0 of 1: 2 rounds, 0 copies to the host" in done.stdout


class _Device:
    def __init__(self, kind, index=0):
        self.kind, self.index = kind, index

    def __dlpack_device__(self):
        return self.kind, self.index


def test_devices_are_told_apart():
    assert device_of(np.zeros(3), "t") is None
    assert device_of(_Device(1), "t") is None
    assert device_of(_Device(2, 1), "t") == ("cuda", 1)
    with pytest.raises(ValueError, match=r"push_pull\('x'\) input: the tensor is on rocm:0; byteps takes CPU"):
        device_of(_Device(10), "push_pull('x') input")


def test_bad_devices_are_named():
    from byteps.testkit import device_stand_in
    device_stand_in.install()
    try:
        staging = DeviceStaging()
        tensor = device_stand_in.StandInCudaTensor(np.zeros(4, np.float32), device=0)
        staging.stage(tensor, None, "a", "push_pull('a')", None, None)
        elsewhere = device_stand_in.StandInCudaTensor(np.zeros(4, np.float32), device=1)
        with pytest.raises(ValueError, match=r"push_pull\('b'\): the tensor is on cuda:1, but this process drives "
                                             r"cuda:0"):
            staging.stage(elsewhere, None, "b", "push_pull('b')", None, None)
        with pytest.raises(ValueError, match=r"push_pull\('c'\): the input is on cuda:0 but the output on cpu"):
            staging.stage(tensor, np.zeros(4, np.float32), "c", "push_pull('c')", None, None)
        staging.close()
    finally:
        from byteps.common import device_staging
        device_staging.use_engine(None)


def test_without_cupy_the_error_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    staging = DeviceStaging()
    with pytest.raises(ImportError, match="pip install cupy-cuda12x"):
        staging.stage(_Device(2), None, "a", "push_pull('a')", None, None)


def test_cupy_is_not_imported_for_host_tensors():
    """CPU installs stay as they are: a job of host tensors never imports CuPy (or pynvml)."""
    code = ("import sys, numpy as np, byteps.common as bps; bps.init(); "
            "x = np.ones(10, np.float32); bps.push_pull(x, 'x'); bps.shutdown(); "
            "print('imported', sorted(m for m in ('cupy', 'pynvml') if m in sys.modules))")
    result = run_job([sys.executable, "-c", code], 2, 1)
    assert_ok(result)
    assert "imported []" in result.outputs["worker1"]


def test_local_ranks_that_disagree_on_gpu_sums_fail_naming_it():
    """One local rank sums on the GPU, the other with BYTEPS_GPU_LOCAL_AGGREGATION=0: both fail, and say so."""
    code = ("import os, numpy as np\n"
            "if os.environ['BYTEPS_LOCAL_RANK'] == '1': os.environ['BYTEPS_GPU_LOCAL_AGGREGATION'] = '0'\n"
            "import byteps.common as bps\n"
            "from byteps.common.api import worker\n"
            "from byteps.testkit import device_stand_in\n"
            "device_stand_in.install()\n"
            "bps.init()\n"
            "tensor = device_stand_in.StandInCudaTensor(np.ones(5000, np.float32))\n"
            "try:\n"
            "    worker().push_pull_async(tensor, 'w').wait()\n"
            "except Exception as exc:\n"
            "    print('FAILED:', exc, flush=True)\n"
            "else:\n"
            "    print('NO ERROR', flush=True)\n"
            "bps.shutdown()\n")
    result = run_job([sys.executable, "-c", code], 1, 1, local_size=2, timeout=60)
    assert_ok(result)
    for rank in (0, 1):
        text = result.outputs[f"worker{rank}"]
        assert "FAILED:" in text and "as a CUDA tensor summed on the GPU" in text, text
