"""DistributedOptimizer checks, run on every rank (any number of workers, 1 included).

Every rank feeds its own data; each check recomputes, in this process, what
every rank computes, and compares the parameters after the distributed step
with plain SGD on the averaged gradients.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import warnings

import torch
from check_runner import assert_close, check, expect_error

import byteps.torch as bps
from byteps.common import api

LR = 0.1


class Net(torch.nn.Module):
    """Two layers and a branch ``c`` that the forward may leave out."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 3)
        self.b = torch.nn.Linear(3, 2)
        self.c = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor, use_c: bool = True) -> torch.Tensor:
        hidden = torch.tanh(self.a(x))
        return self.b(hidden) + self.c(hidden) if use_c else self.b(hidden)


def make_net(seed: int) -> Net:
    torch.manual_seed(seed)
    return Net()


def batch(rank: int, step: int) -> torch.Tensor:
    return torch.randn(5, 4, generator=torch.Generator().manual_seed(1000 * rank + step))


def loss_of(model: Net, rank: int, step: int, use_c: bool = True) -> torch.Tensor:
    return (model(batch(rank, step), use_c) ** 2).mean()


def named(model: torch.nn.Module, tag: str) -> list:
    """Parameter names unique to one check, so checks never share a tensor name."""
    return [(f"{tag}.{name}", p) for name, p in model.named_parameters()]


def gradients(model: Net, rank: int, steps=(0,), use_c: bool = True) -> dict:
    """What ``rank`` accumulates over ``steps`` backward passes, per parameter name."""
    model = copy.deepcopy(model)
    model.zero_grad()
    for step in steps:
        loss_of(model, rank, step, use_c).backward()
    return {name: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
            for name, p in model.named_parameters()}


def reduced(model: Net, op: str = "mean", **kwargs) -> dict:
    """Every rank's gradients, averaged (or summed) as byteps should."""
    per_rank = [gradients(model, r, **kwargs) for r in range(bps.size())]
    total = {name: sum(g[name] for g in per_rank) for name in per_rank[0]}
    return {name: (g / bps.size() if op == "mean" else g) for name, g in total.items()}


def sgd_expected(model: Net, grads: dict, names=None) -> dict:
    return {name: p.detach() - LR * grads[name] for name, p in model.named_parameters()
            if names is None or name in names}


def assert_parameters(model: Net, expected: dict, what: str, **tolerance) -> None:
    params = dict(model.named_parameters())
    for name, value in expected.items():
        assert_close(params[name].detach(), value, f"{what}: {name}", **tolerance)


def check_average_overlaps_backward() -> None:
    model = make_net(1)
    optimizer = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                         named_parameters=named(model, "avg"))
    expected = sgd_expected(model, reduced(model))
    optimizer.zero_grad()
    loss_of(model, bps.rank(), 0).backward()
    # the hooks have already started every push_pull during backward
    assert len(optimizer._pending) == (6 if bps.size() > 1 else 0), optimizer._pending
    optimizer.step()
    assert_parameters(model, expected, "averaged step")


def check_backward_passes_per_step() -> None:
    model = make_net(2)
    optimizer = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                         named_parameters=named(model, "bpps"), backward_passes_per_step=2)
    expected = sgd_expected(model, reduced(model, steps=(0, 1)))
    optimizer.zero_grad()
    loss_of(model, bps.rank(), 0).backward()
    assert not optimizer._pending, "a push_pull started after the first of two passes"
    loss_of(model, bps.rank(), 1).backward()
    assert len(optimizer._pending) == (6 if bps.size() > 1 else 0)
    optimizer.step()
    assert_parameters(model, expected, "two accumulated passes")
    if bps.size() > 1:
        optimizer.zero_grad()
        for step in range(2):
            loss_of(model, bps.rank(), step).backward()
        try:
            loss_of(model, bps.rank(), 2).backward()
        except RuntimeError as exc:
            assert "backward_passes_per_step" in str(exc), exc
        else:
            raise AssertionError("a third backward pass before step() did not raise")
        optimizer.synchronize()   # drain: every rank submitted the same push_pulls
        optimizer.zero_grad()


def check_skip_synchronize_with_clipping() -> None:
    model = make_net(3)
    optimizer = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                         named_parameters=named(model, "clip"))
    average = reduced(model)
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in average.values()]))
    factor = min(1.0, 0.05 / (float(norm) + 1e-6))
    assert factor < 0.5, f"the check needs clipping to bite (norm {float(norm)})"
    expected = sgd_expected(model, {name: g * factor for name, g in average.items()})
    optimizer.zero_grad()
    loss_of(model, bps.rank(), 0).backward()
    optimizer.synchronize()
    for name, p in model.named_parameters():
        assert_close(p.grad, average[name], f"synchronized gradient of {name}")
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.05)
    with optimizer.skip_synchronize():
        optimizer.step()
    assert_parameters(model, expected, "clipped step")

    # step() after synchronize() without the context: warns, and does not reduce again
    expected = sgd_expected(model, {name: g * 0.5 for name, g in reduced(model).items()})
    optimizer.zero_grad()
    loss_of(model, bps.rank(), 0).backward()
    optimizer.synchronize()
    for p in model.parameters():
        p.grad.mul_(0.5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        optimizer.step()
    if bps.size() > 1:
        assert any("skip_synchronize" in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert_parameters(model, expected, "step after an explicit synchronize")


def check_fp16_compression() -> None:
    model = make_net(4)
    optimizer = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                         named_parameters=named(model, "fp16"), compression=bps.Compression.fp16)
    average = reduced(model)
    optimizer.zero_grad()
    loss_of(model, bps.rank(), 0).backward()
    optimizer.synchronize()
    rounded = False
    for name, p in model.named_parameters():
        assert p.grad.dtype == torch.float32, p.grad.dtype
        assert_close(p.grad, average[name], f"fp16 gradient of {name}", rtol=2e-3, atol=1e-4)
        rounded |= not torch.equal(p.grad, average[name])
    assert rounded or bps.size() == 1, "fp16 compression left every gradient bit-identical"
    with optimizer.skip_synchronize():
        optimizer.step()


def check_requires_grad_changes() -> None:
    model = make_net(5)
    model.b.requires_grad_(False)
    optimizer = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                         named_parameters=named(model, "rg"))

    def step(what: str, trainable: set, pending: int) -> None:
        grads = reduced(model)
        expected = {name: (p.detach() - LR * grads[name] if name.split(".")[0] in trainable else p.detach().clone())
                    for name, p in model.named_parameters()}
        optimizer.zero_grad()
        loss_of(model, bps.rank(), 0).backward()
        if bps.size() > 1:
            assert len(optimizer._pending) == pending, (what, len(optimizer._pending))
        optimizer.step()
        assert_parameters(model, expected, what)

    step("b frozen from the start", {"a", "c"}, 4)
    model.b.requires_grad_(True)
    step("b unfrozen (no hook yet: reduced at step)", {"a", "b", "c"}, 4)
    step("b unfrozen (hooked since)", {"a", "b", "c"}, 6)
    model.a.requires_grad_(False)
    step("a frozen later", {"b", "c"}, 4)


def check_unused_parameters() -> None:
    model = make_net(6)
    optimizer = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                         named_parameters=named(model, "unused"))
    # only rank 0 runs branch c: the others push zeros for it
    per_rank = [gradients(model, r, use_c=(r == 0)) for r in range(bps.size())]
    average = {name: sum(g[name] for g in per_rank) / bps.size() for name in per_rank[0]}
    expected = sgd_expected(model, average)
    optimizer.zero_grad()
    loss_of(model, bps.rank(), 0, use_c=bps.rank() == 0).backward()
    optimizer.step()
    assert_parameters(model, expected, "branch used on rank 0 only")


def check_predivide_and_sum() -> None:
    model = make_net(7)
    optimizer = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                         named_parameters=named(model, "predivide"), gradient_predivide_factor=4.0)
    expected = sgd_expected(model, reduced(model))
    optimizer.zero_grad()
    loss_of(model, bps.rank(), 0).backward()
    optimizer.step()
    assert_parameters(model, expected, "gradient_predivide_factor=4")

    model = make_net(8)
    optimizer = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                         named_parameters=named(model, "sum"), op=bps.Sum)
    expected = sgd_expected(model, reduced(model, op="sum"))
    optimizer.zero_grad()
    loss_of(model, bps.rank(), 0).backward()
    optimizer.step()
    assert_parameters(model, expected, "op=Sum")


def check_errors() -> None:
    model = make_net(9)
    sgd = torch.optim.SGD(model.parameters(), lr=LR)
    expect_error(ValueError, "duplicates: w", lambda: bps.DistributedOptimizer(
        sgd, named_parameters=[("w", model.a.weight), ("w", model.b.weight)] + named(model, "dup")))
    expect_error(ValueError, "not in it", lambda: bps.DistributedOptimizer(
        sgd, named_parameters=[("a", model.a.weight)]))
    expect_error(ValueError, "(name, parameter) tuples", lambda: bps.DistributedOptimizer(
        sgd, named_parameters=[p for p in model.parameters()]))
    expect_error(ValueError, "backward_passes_per_step", lambda: bps.DistributedOptimizer(
        sgd, backward_passes_per_step=0))
    optimizer = bps.DistributedOptimizer(sgd, named_parameters=named(model, "errors"))
    expect_error(ValueError, "already a DistributedOptimizer", lambda: bps.DistributedOptimizer(optimizer))
    if bps.size() == 1:
        return
    loss_of(model, bps.rank(), 0).backward()
    expect_error(ValueError, "zero_grad", optimizer.zero_grad)
    optimizer.step()
    optimizer.zero_grad()

    model = make_net(11)   # a fresh model: the first wrapper's hooks stay on the old one
    optimizer = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                         named_parameters=named(model, "errors2"), backward_passes_per_step=2)
    loss_of(model, bps.rank(), 0).backward()
    expect_error(ValueError, "zero_grad", optimizer.zero_grad)   # between two accumulated passes
    loss_of(model, bps.rank(), 1).backward()
    optimizer.step()
    optimizer.zero_grad()


def check_wrapper_shares_state() -> None:
    model = make_net(10)
    base = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    base.state[model.a.weight]["marker"] = 1
    optimizer = bps.DistributedOptimizer(base, named_parameters=named(model, "share"))
    assert isinstance(optimizer, torch.optim.SGD) and type(optimizer).__name__ == "SGD", type(optimizer).__mro__
    assert optimizer.state is base.state and optimizer.param_groups is base.param_groups
    assert optimizer.defaults["momentum"] == 0.9
    calls = []
    optimizer.register_step_pre_hook(lambda *args: calls.append("pre"))
    optimizer.register_step_post_hook(lambda *args: calls.append("post"))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    optimizer.zero_grad()
    loss_of(model, bps.rank(), 0).backward()
    optimizer.step()
    scheduler.step()
    assert calls == ["pre", "post"], calls
    assert base.param_groups[0]["lr"] == LR * 0.5
    assert "momentum_buffer" in base.state[model.a.weight]
    state = optimizer.state_dict()
    optimizer.load_state_dict(state)
    optimizer.zero_grad()
    loss_of(model, bps.rank(), 1).backward()
    optimizer.step()


def check_rewrapping_moves_hooks() -> None:
    model = make_net(12)
    first = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                     named_parameters=named(model, "rewrap"))
    second = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR),
                                      named_parameters=named(model, "rewrap"))
    expected = sgd_expected(model, reduced(model))
    second.zero_grad()
    loss_of(model, bps.rank(), 0).backward()
    assert not first._pending, "the first optimizer's hooks still fire"
    assert len(second._pending) == (6 if bps.size() > 1 else 0)
    second.step()
    assert_parameters(model, expected, "step of the second wrapper")


@contextlib.contextmanager
def fusion_threshold(threshold: int):
    """Run with another BYTEPS_FUSION_THRESHOLD, as if the job had been started with it."""
    worker = api.worker()
    saved = worker.config
    worker.config = dataclasses.replace(saved, fusion_threshold=threshold)
    try:
        yield
    finally:
        worker.config = saved


class Wide(torch.nn.Module):
    """Many small parameters (fused) around one weight above BYTEPS_FUSION_MAX_TENSOR_BYTES (alone)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(8, 32)
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(32) for _ in range(6))
        self.mid = torch.nn.Linear(32, 600)     # 76.8 KB weight: never fused
        self.out = torch.nn.Linear(600, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for norm in self.norms:
            h = torch.tanh(norm(h))
        return self.out(torch.relu(self.mid(h)))


def check_fusion_matches_unfused() -> None:
    results, buckets = {}, {}
    for threshold in (0, 4096000, 600):   # off, one bucket, several buckets
        torch.manual_seed(13)
        model = Wide()
        with fusion_threshold(threshold):
            optimizer = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9),
                                                 named_parameters=named(model, f"fusion{threshold}"))
            for step in range(4):
                optimizer.zero_grad()
                x = torch.randn(6, 8, generator=torch.Generator().manual_seed(100 * bps.rank() + step))
                (model(x) ** 2).mean().backward()
                optimizer.step()
        results[threshold] = {name: p.detach().clone() for name, p in model.named_parameters()}
        buckets[threshold] = {b.name for plan in optimizer._plans.values() for b in plan.values()}
    if bps.size() > 1:
        assert not buckets[0], buckets[0]
        assert len(buckets[4096000]) == 1 and len(buckets[600]) > 2, buckets
    for threshold in (4096000, 600):
        for name, value in results[0].items():
            difference = float((results[threshold][name] - value).abs().max())
            assert difference < 1e-6, f"threshold {threshold}: {name} differs by {difference}"


def main() -> None:
    bps.init()
    torch.set_num_threads(1)
    check("average_overlaps_backward", check_average_overlaps_backward)
    check("backward_passes_per_step", check_backward_passes_per_step)
    check("skip_synchronize_with_clipping", check_skip_synchronize_with_clipping)
    check("fp16_compression", check_fp16_compression)
    check("requires_grad_changes", check_requires_grad_changes)
    check("unused_parameters", check_unused_parameters)
    check("predivide_and_sum", check_predivide_and_sum)
    check("errors", check_errors)
    check("wrapper_shares_state", check_wrapper_shares_state)
    check("rewrapping_moves_hooks", check_rewrapping_moves_hooks)
    check("fusion_matches_unfused", check_fusion_matches_unfused)
    bps.shutdown()


if __name__ == "__main__":
    main()
