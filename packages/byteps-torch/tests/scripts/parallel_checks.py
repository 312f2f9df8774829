"""byteps.torch.parallel checks, run on every rank of a 2-or-more-worker job.

Each rank feeds its own data and recomputes, in this process, every rank's
gradients, so it knows the average that should come out.
"""

from __future__ import annotations

import copy
import os

import torch
import torch.distributed as dist
from check_runner import assert_close, check, expect_error

import byteps.torch as bps
from byteps.common import api
from byteps.torch.parallel import DistributedDataParallel, byteps_hook


class Net(torch.nn.Module):
    """BatchNorm first (buffers to broadcast), and a branch ``c`` the forward may leave out."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(4)
        self.a = torch.nn.Linear(4, 3)
        self.b = torch.nn.Linear(3, 2)
        self.c = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor, use_c: bool = True) -> torch.Tensor:
        hidden = torch.tanh(self.a(self.bn(x)))
        return self.b(hidden) + self.c(hidden) if use_c else self.b(hidden)


def make_net(rank: int) -> Net:
    """Weights and buffers that differ per rank, so a missing broadcast shows."""
    torch.manual_seed(100 + rank)
    net = Net()
    net.bn.running_mean.fill_(float(rank))
    return net


def batch(rank: int, step: int) -> torch.Tensor:
    return torch.randn(6, 4, generator=torch.Generator().manual_seed(1000 * rank + step))


def loss_of(model: torch.nn.Module, rank: int, step: int, use_c: bool = True) -> torch.Tensor:
    return (model(batch(rank, step), use_c) ** 2).mean()


def local_gradients(model: torch.nn.Module, rank: int, steps=(0,), use_c: bool = True) -> dict:
    """What ``rank`` accumulates over ``steps`` passes of a plain copy of ``model``."""
    model = copy.deepcopy(model)
    for step in steps:
        loss_of(model, rank, step, use_c).backward()
    return {name: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
            for name, p in model.named_parameters()}


def averaged(model: torch.nn.Module, **kwargs) -> dict:
    per_rank = [local_gradients(model, r, **kwargs) for r in range(bps.size())]
    return {name: sum(g[name] for g in per_rank) / bps.size() for name in per_rank[0]}


def assert_gradients(model: torch.nn.Module, expected: dict, what: str, **tolerance) -> None:
    for name, p in model.named_parameters():
        assert_close(p.grad, expected[name], f"{what}: gradient of {name}", **tolerance)


def check_broadcast_at_construction() -> None:
    root = make_net(0)
    model = DistributedDataParallel(make_net(bps.rank()))
    for (name, mine), theirs in zip(model.module.state_dict().items(), root.state_dict().values()):
        assert_close(mine, theirs, f"{name} after construction", rtol=0, atol=0)
    model = DistributedDataParallel(make_net(bps.rank()), broadcast_buffers=False)
    assert_close(model.module.a.weight.detach(), root.a.weight.detach(), "weights", rtol=0, atol=0)
    assert float(model.module.bn.running_mean[0]) == bps.rank(), "broadcast_buffers=False broadcast the buffers"


def check_average_in_backward() -> None:
    model = DistributedDataParallel(make_net(bps.rank()))
    # what the others compute: rank 0's weights and buffers, broadcast again at forward
    expected = averaged(model.module)
    model.module.bn.running_mean.fill_(42.0 + bps.rank())   # the forward's buffer broadcast makes it 42
    loss_of(model, bps.rank(), 0).backward()
    assert not model._pending, "push_pulls still pending after backward"
    assert_gradients(model.module, expected, "after backward")
    # BatchNorm then updated rank 0's running mean with this rank's batch
    momentum = model.module.bn.momentum
    assert_close(model.module.bn.running_mean, (1 - momentum) * 42.0 + momentum * batch(bps.rank(), 0).mean(0),
                 "running mean after one training forward")


def check_no_sync() -> None:
    model = DistributedDataParallel(make_net(bps.rank()), broadcast_buffers=False)
    local = local_gradients(model.module, bps.rank())
    expected = averaged(model.module, steps=(0, 1))
    with model.no_sync():
        loss_of(model, bps.rank(), 0).backward()
    assert_gradients(model.module, local, "inside no_sync (local only)", rtol=0, atol=0)
    loss_of(model, bps.rank(), 1).backward()
    assert_gradients(model.module, expected, "after the pass that follows no_sync")


def check_unused_parameters() -> None:
    model = DistributedDataParallel(make_net(bps.rank()), broadcast_buffers=False)
    per_rank = [local_gradients(model.module, r, use_c=(r == 0)) for r in range(bps.size())]
    expected = {name: sum(g[name] for g in per_rank) / bps.size() for name in per_rank[0]}
    loss_of(model, bps.rank(), 0, use_c=bps.rank() == 0).backward()
    assert_gradients(model.module, expected, "branch used on rank 0 only")


def check_requires_grad_changes() -> None:
    net = make_net(bps.rank())
    net.b.requires_grad_(False)       # frozen before wrapping: b gets no hook at construction
    model = DistributedDataParallel(net, broadcast_buffers=False)
    expected = averaged(model.module)
    loss_of(model, bps.rank(), 0).backward()
    assert model.module.b.weight.grad is None
    for name in ("a.weight", "c.weight", "bn.weight"):
        assert_close(model.module.get_parameter(name).grad, expected[name], name)
    model.module.zero_grad()
    model.module.b.requires_grad_(True)
    for step in (1, 2):    # no hook yet (reduced at the end of backward), then hooked
        expected = averaged(model.module, steps=(step,))
        loss_of(model, bps.rank(), step).backward()
        assert_gradients(model.module, expected, f"b unfrozen, pass {step}")
        model.module.zero_grad()


def check_fp16_compression() -> None:
    model = DistributedDataParallel(make_net(bps.rank()), broadcast_buffers=False, compression=bps.Compression.fp16)
    expected = averaged(model.module)
    loss_of(model, bps.rank(), 0).backward()
    assert_gradients(model.module, expected, "fp16", rtol=2e-3, atol=1e-4)
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())


def check_native_ddp_hook() -> None:
    dist.init_process_group("gloo", init_method="file://" + os.path.join(os.environ["BYTEPS_TEST_TMP"], "pg"),
                            rank=bps.rank(), world_size=bps.size())
    try:
        models = []
        for state in (None, "second-model"):
            model = torch.nn.parallel.DistributedDataParallel(make_net(bps.rank()), bucket_cap_mb=0.0001)
            model.register_comm_hook(state=state, hook=byteps_hook)
            models.append(model)
        for step in range(3):    # torch rebuilds its buckets after the first step
            for model in models:
                expected = averaged(model.module, steps=(step,))
                model.zero_grad()
                loss_of(model, bps.rank(), step).backward()
                assert_gradients(model.module, expected, f"native DDP, step {step}")
        # the buckets really went through byteps, under each model's own names
        declared = api.worker().registry.tensor_ids
        for prefix in ("byteps_hook.bucket", "second-model.bucket"):
            assert any(name.startswith(prefix) for name in declared), (prefix, sorted(declared))
        model = models[0]
        expected = averaged(model.module, steps=(3, 4))
        model.zero_grad()
        with model.no_sync():
            loss_of(model, bps.rank(), 3).backward()
        loss_of(model, bps.rank(), 4).backward()
        assert_gradients(model.module, expected, "native DDP after no_sync")
    finally:
        dist.destroy_process_group()


def check_errors() -> None:
    expect_error(ValueError, "one device per process", lambda: DistributedDataParallel(Net(), device_ids=[0, 1]))


def main() -> None:
    bps.init()
    torch.set_num_threads(1)
    assert bps.size() > 1, "run this under bpslaunch with two or more workers"
    check("broadcast_at_construction", check_broadcast_at_construction)
    check("average_in_backward", check_average_in_backward)
    check("no_sync", check_no_sync)
    check("unused_parameters", check_unused_parameters)
    check("requires_grad_changes", check_requires_grad_changes)
    check("fp16_compression", check_fp16_compression)
    check("native_ddp_hook", check_native_ddp_hook)
    check("errors", check_errors)
    bps.shutdown()


if __name__ == "__main__":
    main()
