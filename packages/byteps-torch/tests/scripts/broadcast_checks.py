"""Worker script: broadcast of tensors, parameters, optimizer state and objects.

Run under bpslaunch (2 ranks). Every rank builds what the root had from the
same seeds, so it can check exactly what it received. Prints ``OK <check>``
per check and ``ALL OK <n>`` at the end; the first failure exits 1.
"""

from __future__ import annotations

import torch
from check_runner import Checks, assert_equal, expect_error
from torch import nn

import byteps.torch as bps

DTYPES = [torch.float16, torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int64,
          torch.bool, torch.uint8, torch.int8, torch.int16]
SHAPES = [(5,), (2, 3), (2, 1, 4)]
checks = Checks()


def value(shape, dtype, r):
    k = torch.arange(int(torch.Size(shape).numel())).reshape(shape)
    if dtype == torch.bool:
        return (k + r) % 3 == 0
    if dtype.is_floating_point:
        return ((k % 11 - 5) * 0.25 * (r + 1)).to(dtype)
    return ((k % 11) * (r + 1) + r).to(dtype)


def tensors():
    r = bps.rank()
    for root in sorted({0, bps.size() - 1}):
        for dtype in DTYPES:
            for shape in SHAPES:
                tag = f"{str(dtype)[6:]}.{len(shape)}d.root{root}"
                want = value(shape, dtype, root)
                x = value(shape, dtype, r)
                original = x.clone()
                assert_equal(bps.broadcast(x, root, name=f"b.{tag}"), want, f"broadcast {tag}")
                assert_equal(x, original, f"broadcast {tag} left its input alone")
                assert bps.broadcast_(x, root, name=f"b_.{tag}") is x
                assert_equal(x, want, f"broadcast_ {tag}")
                h = bps.broadcast_async(value(shape, dtype, r), root, name=f"ba.{tag}")
                assert_equal(bps.synchronize(h), want, f"broadcast_async {tag}")
                y = value(shape, dtype, r)
                h = bps.broadcast_async_(y, root, name=f"ba_.{tag}")
                assert bps.synchronize(h) is y
                assert_equal(y, want, f"broadcast_async_ {tag}")
    # unnamed, and differentiable as in Horovod: averaged gradient at the root, zeros elsewhere
    n, root = bps.size(), bps.size() - 1
    t = torch.full((3,), float(r + 1), requires_grad=True)
    y = bps.broadcast(t, root_rank=root)
    assert_equal(y.detach(), torch.full((3,), float(root + 1)), "unnamed broadcast")
    (y * (r + 1)).sum().backward()
    want = torch.full((3,), (n + 1) / 2 if r == root else 0.0)
    assert_equal(t.grad, want, "gradient of broadcast")


def make_model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))


def perturbed_model(seed, r):
    model = make_model(seed)
    with torch.no_grad():
        model[1].running_mean.fill_(float(r))
        model[1].num_batches_tracked += r
    return model


def assert_same_state(actual, expected, what):
    assert list(actual) == list(expected), f"{what}: keys {list(actual)} != {list(expected)}"
    for key in expected:
        assert_equal(actual[key], expected[key], f"{what}[{key}]")


def parameters():
    r, last = bps.rank(), bps.size() - 1
    model = perturbed_model(100 + r, r)
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    assert_same_state(model.state_dict(), perturbed_model(100, 0).state_dict(), "state_dict from root 0")
    model = make_model(200 + r)
    bps.broadcast_parameters(model.named_parameters(), root_rank=last)
    assert_same_state(model.state_dict(), make_model(200 + last).state_dict(), "named_parameters from the last rank")
    model = make_model(300 + r)
    bps.broadcast_parameters(list(model.parameters()), root_rank=0)
    assert_same_state(model.state_dict(), make_model(300).state_dict(), "parameters() without names")
    odd = {"w": torch.arange(6.0).reshape(2, 3).t() * (r + 1)}  # not contiguous: goes through a copy
    bps.broadcast_parameters(odd, root_rank=0)
    assert_equal(odd["w"], torch.arange(6.0).reshape(2, 3).t(), "non-contiguous parameter")


# --- optimizer state ---------------------------------------------------------------------


def make_adam_setup(r):
    """A model, a parameter that never gets a gradient, a frozen one, and Adam over all in two groups."""
    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    unused = nn.Parameter(torch.ones(2))
    frozen = nn.Parameter(torch.ones(3), requires_grad=False)
    optimizer = torch.optim.Adam([{"params": list(model.parameters()) + [unused]},
                                  {"params": [frozen], "lr": 0.5 + r}],
                                 lr=0.01 * (r + 1), betas=(0.8 + 0.01 * r, 0.9))
    return model, unused, optimizer


def train(model, optimizer, steps, seed, extra=()):
    torch.manual_seed(seed)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(torch.randn(5, 4)).pow(2).sum() + sum(p.sum() for p in extra)
        loss.backward()
        optimizer.step()


def root_adam():
    model, unused, optimizer = make_adam_setup(0)
    train(model, optimizer, 2, seed=11)
    return model, unused, optimizer


def compare_optimizers(actual, expected, what):
    assert len(actual.param_groups) == len(expected.param_groups)
    for g, (mine, theirs) in enumerate(zip(actual.param_groups, expected.param_groups)):
        for key in theirs:
            if key != "params":
                assert mine[key] == theirs[key], f"{what}: group {g} {key}={mine[key]!r}, root has {theirs[key]!r}"
        for i, (p, q) in enumerate(zip(mine["params"], theirs["params"])):
            state, want = actual.state.get(p, {}), expected.state.get(q, {})
            assert list(state) == list(want), f"{what}: group {g} param {i} state keys {list(state)} != {list(want)}"
            for key, value in want.items():
                if isinstance(value, torch.Tensor):
                    assert_equal(state[key], value, f"{what}: group {g} param {i} {key}")
                else:
                    assert state[key] == value, f"{what}: group {g} param {i} {key}={state[key]!r} != {value!r}"


def optimizer_state():
    r = bps.rank()
    # (a) state not created yet on the other ranks: root trained, others fresh
    if r == 0:
        model, unused, optimizer = root_adam()
    else:
        model, unused, optimizer = make_adam_setup(r)
    before = [p.detach().clone() for p in model.parameters()]
    bps.broadcast_optimizer_state(optimizer, root_rank=0)
    _, ref_unused, reference = root_adam()
    compare_optimizers(optimizer, reference, "lazily created Adam state")
    assert unused not in optimizer.state or not optimizer.state[unused], "a parameter without gradient got state"
    for p, q in zip(model.parameters(), before):
        assert_equal(p.detach(), q, "broadcast_optimizer_state left the parameters alone")
    # (b) the others have state the root lacks (the unused parameter) and another step count
    if r != 0:
        model, unused, optimizer = make_adam_setup(r)
        train(model, optimizer, 1, seed=20 + r, extra=(unused,))
        assert optimizer.state[unused]
    bps.broadcast_optimizer_state(optimizer, root_rank=0)
    compare_optimizers(optimizer, reference, "other ranks with extra and different state")
    # with the root's parameters too, one more identical step gives the root's result everywhere
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    train(model, optimizer, 1, seed=30)
    reference_model, _, reference = root_adam()
    train(reference_model, reference, 1, seed=30)
    assert_same_state(model.state_dict(), reference_model.state_dict(), "a step after the broadcasts")


def sgd_momentum_and_scalars():
    r = bps.rank()

    class CountingSGD(torch.optim.SGD):
        """SGD that also keeps plain Python values in its state."""

        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        self.state[p]["count"] = self.state[p].get("count", 0) + 1
                        self.state[p]["note"] = f"lr was {group['lr']}"
            return super().step(closure)

    def setup(rank_, trained):
        torch.manual_seed(3)
        model = nn.Linear(4, 2)
        optimizer = CountingSGD(model.parameters(), lr=0.1 * (rank_ + 1), momentum=0.5 + 0.1 * rank_,
                                weight_decay=0.01 * rank_)
        if trained:
            train(nn.Sequential(model, nn.Linear(2, 4)), optimizer, 3, seed=5)
        return model, optimizer

    root = bps.size() - 1
    model, optimizer = setup(r, trained=r == root)
    bps.broadcast_optimizer_state(optimizer, root_rank=root)
    _, reference = setup(root, trained=True)
    compare_optimizers(optimizer, reference, "SGD momentum, hyperparameters and Python scalars")
    # through DistributedOptimizer (a subclass sharing the optimizer's state)
    model, optimizer = setup(r, trained=r == root)
    wrapped = bps.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    bps.broadcast_optimizer_state(wrapped, root_rank=root)
    compare_optimizers(wrapped, reference, "through DistributedOptimizer")


def optimizer_errors():
    r = bps.rank()
    model = nn.Linear(4, 3 + 2 * r)  # another rank builds a different optimizer: every rank must fail
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    text = "the root has" if r != 0 else "another rank's optimizer"
    expect_error(ValueError, text, lambda: bps.broadcast_optimizer_state(optimizer, root_rank=0))


def objects():
    r, last = bps.rank(), bps.size() - 1
    mine = {"rank": r, "items": [1, 2, r], "tensor": torch.arange(3) * r, "nested": {"x": (r, "y")}}
    got = bps.broadcast_object(mine, root_rank=0)
    if r == 0:
        assert got is mine
    assert got["rank"] == 0 and got["items"] == [1, 2, 0] and got["nested"] == {"x": (0, "y")}, got
    assert_equal(got["tensor"], torch.zeros(3, dtype=torch.int64), "tensor inside an object")
    big = bytes((i * (last + 1)) % 251 for i in range(200_000)) if r == last else None
    got = bps.broadcast_object(big, root_rank=last, name="big")
    assert got == bytes((i * (last + 1)) % 251 for i in range(200_000)), "200 kB object"
    for size in (0, 5, 1000, 70_000, 3):  # one name, sizes up and down
        got = bps.broadcast_object("x" * size + str(r), root_rank=last, name="epoch")
        assert got == "x" * size + str(last), f"object of {size} characters"
    assert bps.broadcast_object(None if r == 0 else "not none", root_rank=0) is None
    unpicklable = (lambda: None) if r == last else 1  # the root fails to pickle: every rank gets an error
    kind, text = (Exception, "pickle") if r == last else (ValueError, f"rank {last} could not pickle")
    expect_error(kind, text, lambda: bps.broadcast_object(unpicklable, root_rank=last, name="bad"))
    assert bps.broadcast_object(r, root_rank=last, name="bad") == last  # and the name still works


def main():
    bps.init()
    checks.run("broadcast tensors of every dtype, both roots, all variants, gradient", tensors)
    checks.run("broadcast_parameters", parameters)
    checks.run("broadcast_optimizer_state: lazy state, params without grads", optimizer_state)
    checks.run("broadcast_optimizer_state: momentum, hyperparameters, scalars, DistributedOptimizer",
        sgd_momentum_and_scalars)
    checks.run("broadcast_optimizer_state errors on every rank", optimizer_errors)
    checks.run("broadcast_object", objects)
    bps.shutdown()
    checks.done()


if __name__ == "__main__":
    main()
