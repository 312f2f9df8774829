"""push_pull, allreduce and broadcast: through real jobs (bpslaunch, scheduler, servers), and in one process.

The jobs run scripts/ops_checks.py, which checks many things per rank,
under the two layouts every multi-worker script must work under, and once
under MXNet's NaiveEngine (every op synchronous).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from mxnet_jobs import launch_mxnet_job

from byteps.testkit import JOB_LAYOUTS, assert_all_ok, rank_lines

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")


@pytest.mark.parametrize("layout", JOB_LAYOUTS)
def test_ops_under_bpslaunch(layout):
    result = launch_mxnet_job(JOB_LAYOUTS[layout], os.path.join(SCRIPTS, "ops_checks.py"))
    assert_all_ok(result, checks=9)
    local_size = 2 if layout == "one-machine-np2" else 1
    for rank in range(2):
        info = [line for line in rank_lines(result.stdout, rank) if line.startswith("INFO")]
        assert info == [f"INFO rank={rank} size=2 local_rank={rank % local_size} local_size={local_size}"], info


def test_ops_under_the_naive_engine():
    result = launch_mxnet_job(JOB_LAYOUTS["one-machine-np2"], os.path.join(SCRIPTS, "ops_checks.py"),
                     env={"MXNET_ENGINE_TYPE": "NaiveEngine"})
    assert_all_ok(result, checks=7)  # without the engine-order checks: every op is synchronous there


# --- one process: no scheduler or server, push_pull is a copy (as in BytePS) -----------------



DTYPES = ["float16", "float32", "float64", "int32", "int64"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_single_process_ops_are_the_identity(bps, dtype):
    import mxnet as mx

    assert (bps.size(), bps.rank(), bps.local_size(), bps.local_rank()) == (1, 0, 1, 0)
    values = (np.arange(12) - 5).reshape(3, 4).astype(dtype)
    x = mx.nd.array(values, dtype=dtype)
    bps.byteps_push_pull(x, name=f"local.{dtype}")
    y = bps.allreduce(x, name=f"local.new.{dtype}")
    assert y is not x and y.dtype == np.dtype(dtype)
    assert bps.allreduce_(x, op=bps.Sum, name=f"local_.{dtype}") is x
    for got in (x, y, bps.broadcast(x, 0, name=f"local.b.{dtype}"), bps.broadcast_(x, 0, name=f"local.b_.{dtype}")):
        np.testing.assert_array_equal(got.asnumpy(), values)


def test_single_process_trainer_and_optimizer(bps):
    import mxnet as mx
    from mxnet import autograd, gluon

    def net_after_steps(trainer_of):
        net = gluon.nn.Dense(3, in_units=4, prefix="dense_")
        net.initialize(mx.init.Constant(0.5))
        trainer = trainer_of(net.collect_params())
        for step in range(3):
            with autograd.record():
                loss = (net(mx.nd.ones((2, 4)) * step) ** 2).sum()
            loss.backward()
            trainer.step(2)
        return net.weight.data().asnumpy()

    plain = net_after_steps(lambda p: gluon.Trainer(p, "sgd", {"learning_rate": 0.1}, kvstore=None))
    distributed = net_after_steps(lambda p: bps.DistributedTrainer(p, "sgd", {"learning_rate": 0.1}))
    wrapped = net_after_steps(lambda p: gluon.Trainer(p, bps.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.1)),
                                                      kvstore=None))
    np.testing.assert_allclose(distributed, plain, rtol=1e-6)
    np.testing.assert_allclose(wrapped, plain, rtol=1e-6)


def test_single_process_errors(bps):
    import mxnet as mx

    with pytest.raises(ValueError, match=r"unsupported dtype uint8; byteps reduces float16, float32"):
        bps.byteps_push_pull(mx.nd.ones((3,), dtype="uint8"), name="u8")
    with pytest.raises(ValueError, match="csr"):
        bps.allreduce(mx.nd.ones((2, 2)).tostype("csr"))
    assert bps.allreduce(mx.nd.array([1.0, -2.0]), op=bps.Adasum).asnumpy().tolist() == [1.0, -2.0]   # one rank
    with pytest.raises(NotImplementedError, match="floating-point"):
        bps.allreduce(mx.nd.ones((3,), dtype="int32"), op=bps.Adasum)
    with pytest.raises(ValueError, match="supersedes"):
        bps.allreduce(mx.nd.ones((3,)), average=True, op=bps.Sum)
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        bps.allreduce(mx.nd.ones((3,)), name="")
    with pytest.raises(TypeError, match="expected an mxnet NDArray"):
        bps.byteps_push_pull([1.0, 2.0], name="list")


def test_not_initialized_is_a_clear_error():
    import mxnet as mx

    import byteps.mxnet as bps

    bps.shutdown()
    with pytest.raises(ValueError, match="init"):
        bps.byteps_push_pull(mx.nd.ones((2,)), name="x")


def test_public_api_is_complete():
    import byteps.mxnet as bps

    for name in bps.__all__:
        assert getattr(bps, name) is not None, name
    issue_names = ["init", "shutdown", "size", "rank", "local_size", "local_rank", "byteps_declare_tensor",
                   "byteps_push_pull", "allreduce", "allreduce_", "broadcast", "broadcast_", "broadcast_parameters",
                   "DistributedOptimizer", "DistributedTrainer", "Compression"]
    assert set(issue_names) <= set(bps.__all__)


@pytest.mark.parametrize("layout", JOB_LAYOUTS)
def test_collectives_under_bpslaunch(layout, tmp_path):
    """allgather, alltoall, reducescatter, Min/Max/Product, objects, process sets, join, failures that leave
    the job usable, and the timeline (collectives_checks.py)."""
    result = launch_mxnet_job(JOB_LAYOUTS[layout], os.path.join(SCRIPTS, "collectives_checks.py"),
                              env={"BYTEPS_TEST_TMP": str(tmp_path)})
    assert_all_ok(result, checks=8)
