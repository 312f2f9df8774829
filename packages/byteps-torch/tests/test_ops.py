"""push_pull / allreduce through real jobs (bpslaunch, scheduler, servers), and in one process.

Each job runs a worker script that checks many things per rank (see
scripts/ops_checks.py); the job layouts are the two the issue names.
"""

from __future__ import annotations

import os
import re
import sys

import pytest
import torch

from byteps.testkit import JOB_LAYOUTS, assert_all_ok, launch_job, one_process_adapter, rank_lines

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


@pytest.mark.parametrize("layout", JOB_LAYOUTS)
def test_ops_under_bpslaunch(layout):
    result = launch_job(JOB_LAYOUTS[layout], os.path.join(SCRIPTS, "ops_checks.py"))
    assert_all_ok(result, checks=10)
    local_size = 2 if layout == "one-machine-np2" else 1
    for rank in range(2):
        info = [line for line in rank_lines(result.stdout, rank) if line.startswith("INFO")]
        assert info == [f"INFO rank={rank} size=2 local_rank={rank % local_size} local_size={local_size}"], info


def test_ops_with_servers_of_their_own():
    # BYTEPS_ENABLE_IPC=0: every payload over TCP, as with servers on hosts of their own (Adasum, fusion, fp16).
    result = launch_job(JOB_LAYOUTS["two-machines-two-servers"], os.path.join(SCRIPTS, "ops_checks.py"),
                        env={"BYTEPS_ENABLE_IPC": "0"})
    assert_all_ok(result, checks=10)


@pytest.mark.parametrize("layout", JOB_LAYOUTS)
def test_shape_or_dtype_mismatch_fails_on_every_rank(layout):
    result = launch_job(JOB_LAYOUTS[layout], os.path.join(SCRIPTS, "mismatch_checks.py"))
    assert_all_ok(result, checks=5)
    for rank in range(2):
        lines = rank_lines(result.stdout, rank)
        shape = next(line for line in lines if line.startswith("MISMATCH shape"))
        assert "shape 4, 16 bytes of float32" in shape and "shape 2x2, 16 bytes of float32" in shape, shape
        dtype = next(line for line in lines if line.startswith("MISMATCH dtype"))
        assert "12 bytes of float32" in dtype and "12 bytes of int32" in dtype, dtype
        assert re.search(r"worker [01] declares", shape), shape
        switch = next(line for line in lines if line.startswith("MISMATCH switch dtype"))
        assert "different shapes or dtypes" in switch or "another shape or dtype" in switch, switch


# --- one process: no scheduler or server, push_pull is a copy (as in BytePS) -----------------


@pytest.fixture
def bps(monkeypatch):
    with one_process_adapter(monkeypatch, "byteps.torch") as adapter:
        yield adapter


DTYPES = [torch.float16, torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int64]


@pytest.mark.parametrize("dtype", DTYPES)
def test_single_process_push_pull_is_the_identity(bps, dtype):
    assert (bps.size(), bps.rank(), bps.local_size(), bps.local_rank()) == (1, 0, 1, 0)
    x = (torch.arange(12) - 5).reshape(3, 4).to(dtype)
    y = bps.push_pull(x, name=f"local.{dtype}")
    assert y.dtype == dtype and torch.equal(y, x) and y.data_ptr() != x.data_ptr()
    z = x.clone()
    assert bps.allreduce_(z, op=bps.Sum, name=f"local_.{dtype}") is z and torch.equal(z, x)
    assert torch.equal(bps.broadcast(x, 0, name=f"local.b.{dtype}"), x)


def test_single_process_helpers(bps):
    called = []
    h = bps.push_pull_async(torch.ones(3), name="local.async")
    bps.handle_done_callback(h, lambda: called.append(True))
    assert called == [True] and bps.poll(h)
    assert torch.equal(bps.synchronize(h), torch.ones(3))
    with pytest.raises(ValueError, match="unknown push_pull handle"):
        bps.synchronize(h)
    stamp, speed = bps.get_pushpull_speed()
    assert stamp > 0 and speed >= 0
    assert bps.join() == 0
    bps.barrier()
    obj = {"a": [1, 2]}
    assert bps.broadcast_object(obj) is obj
    t = torch.ones(2, requires_grad=True)
    bps.push_pull(t * 3, name="local.grad").sum().backward()
    assert torch.equal(t.grad, torch.full((2,), 3.0))


def test_single_process_errors(bps):
    with pytest.raises(ValueError, match="not contiguous"):
        bps.push_pull(torch.ones(3, 4).t(), name="nc")
    with pytest.raises(ValueError, match=r"unsupported dtype torch\.uint8.*torch\.bfloat16"):
        bps.push_pull(torch.ones(3, dtype=torch.uint8), name="u8")
    assert torch.equal(bps.allreduce(torch.tensor([1.0, -2.0]), op=bps.Adasum), torch.tensor([1.0, -2.0]))  # one rank
    with pytest.raises(NotImplementedError, match="floating-point"):
        bps.allreduce(torch.ones(3, dtype=torch.int64), op=bps.Adasum)
    with pytest.raises(ValueError, match="meta"):
        bps.allreduce(torch.ones(3, device="meta"))
    with pytest.raises(ValueError, match="dense"):
        bps.allreduce(torch.ones(3).to_sparse())
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        bps.allreduce(torch.ones(3), name="")


def test_api_not_initialized_is_a_clear_error(monkeypatch):
    import byteps.torch as bps

    bps.shutdown()
    with pytest.raises(ValueError, match="init"):
        bps.push_pull(torch.ones(2), name="x")


def test_public_api_is_complete():
    import byteps.torch as bps

    for name in bps.__all__:
        assert getattr(bps, name) is not None, name
    horovod_names = ["init", "shutdown", "size", "rank", "local_size", "local_rank", "allreduce", "allreduce_",
                     "allreduce_async", "allreduce_async_", "broadcast", "broadcast_", "broadcast_async",
                     "broadcast_async_", "poll", "synchronize", "join", "barrier", "Average", "Sum", "Adasum",
                     "Compression", "DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state",
                     "broadcast_object"]
    assert set(horovod_names) <= set(bps.__all__)
    assert "byteps.torch.parallel" in sys.modules
