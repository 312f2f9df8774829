"""Worker script: DistributedOptimizer(op=Adasum), Horovod's Adasum delta optimizer, on every rank.

Each rank trains on its own data. Every check rebuilds, in this process,
what each of the job's ranks does alone (a plain copy of the model and
optimizer per rank, fed that rank's batches), takes each rank's parameter
delta and combines them with byteps.common.frontend.adasum.adasum_tree, the
numpy reference: the parameters after each step must equal
``start + adasum(deltas)`` exactly, and equal on every rank bit for bit.

What the job is decides what is checked: a power-of-two number of workers
runs the training checks and the refusals; another number of workers, or
BYTEPS_ENABLE_ASYNC=1, or BYTEPS_BACKUP_WORKERS, or an elastic job, checks
that refusal only (and every job the refusal before ``bps.init()``).
Prints ``OK <check>`` per check and ``ALL OK <n>``; the first failure exits 1.

Every rank is a leaf of the tree, with one process per machine or several
(ranks 0 and 1, 2 and 3, ... first): Horovod's Adasum on CPU tensors. (On
GPUs Horovod sums each machine's ranks with NCCL first and runs the tree
over machines; byteps has no such hierarchical form.)
"""

from __future__ import annotations

import os
from typing import Callable, Dict, List, Optional

import torch
from check_runner import Checks, expect_error
from torch import nn

import byteps.torch as bps
from byteps.common import api
from byteps.common.frontend.adasum import adasum_tree

STEPS = 3
checks = Checks()


class Net(nn.Module):
    """Two layers and a branch ``c`` that the forward may leave out."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.b = nn.Linear(3, 2)
        self.c = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor, use_c: bool = True) -> torch.Tensor:
        hidden = torch.tanh(self.a(x))
        return self.b(hidden) + self.c(hidden) if use_c else self.b(hidden)


def make_net() -> Net:
    torch.manual_seed(5)  # the same start on every rank
    return Net()


def loss_of(model: Net, rank: int, step: int, use_c: bool = True) -> torch.Tensor:
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1000 * rank + step))
    return (model(x, use_c) - 0.3 * rank).pow(2).mean()


def parameters(model: nn.Module) -> Dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


class Reference:
    """Every rank of the job, alone: one plain model and optimizer per rank, combined by adasum_tree."""

    def __init__(self, make_optimizer: Callable, passes: int = 1, use_c: Callable[[int], bool] = lambda r: True,
                 to_wire: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> None:
        self.models = [make_net() for _ in range(bps.size())]
        self.optimizers = [make_optimizer(model) for model in self.models]
        self.passes, self.use_c, self.to_wire = passes, use_c, to_wire

    def step(self, step: int) -> Dict[str, torch.Tensor]:
        start = parameters(self.models[0])
        deltas: List[Dict[str, torch.Tensor]] = []
        for rank, (model, optimizer) in enumerate(zip(self.models, self.optimizers)):
            optimizer.zero_grad()
            for k in range(self.passes):
                loss_of(model, rank, self.passes * step + k, self.use_c(rank)).backward()
            optimizer.step()
            deltas.append({name: p.detach() - start[name] for name, p in model.named_parameters()})
        if bps.size() == 1:
            combined = parameters(self.models[0])  # one worker: the wrapped optimizer's own step
        else:
            combined = {}
            for name, begin in start.items():
                wire = [self.to_wire(d[name]) for d in deltas]
                summed = adasum_tree([w.float().numpy() if w.dtype == torch.float16 else w.numpy() for w in wire])
                combined[name] = begin + torch.from_numpy(summed).to(wire[0].dtype).to(begin.dtype)
        with torch.no_grad():
            for model in self.models:
                for name, p in model.named_parameters():
                    p.copy_(combined[name])
        return combined


def assert_same_everywhere(model: nn.Module, expected: Dict[str, torch.Tensor], what: str) -> None:
    """This rank's parameters are exactly the reference's, and every rank's are the same bits."""
    mine = parameters(model)
    for name, want in expected.items():
        assert torch.equal(mine[name], want), (
            f"{what}: rank {bps.rank()} {name} = {mine[name].tolist()}, start + adasum(deltas) = {want.tolist()}")
    everyone = bps.allgather_object({name: t.numpy().tobytes() for name, t in mine.items()}, name=f"{what}.agree")
    assert all(other == everyone[0] for other in everyone), f"{what}: the ranks' parameters differ"


def train(tag: str, make_optimizer: Callable, passes: int = 1, use_c: Callable[[int], bool] = lambda r: True,
          compression=None, to_wire: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
          between: Optional[Callable] = None) -> None:
    """STEPS distributed steps of a fresh model, each checked against :class:`Reference`."""
    model = make_net()
    kwargs = {} if compression is None else {"compression": compression}
    optimizer = bps.DistributedOptimizer(make_optimizer(model), op=bps.Adasum, backward_passes_per_step=passes,
                                         named_parameters=[(f"{tag}.{n}", p) for n, p in model.named_parameters()],
                                         **kwargs)
    assert isinstance(optimizer, type(make_optimizer(nn.Linear(1, 1))))
    reference = Reference(make_optimizer, passes, use_c, to_wire)
    for step in range(STEPS):
        optimizer.zero_grad()
        for k in range(passes):
            loss_of(model, bps.rank(), passes * step + k, use_c(bps.rank())).backward()
        if between is not None:
            between(optimizer)
        before = parameters(model)
        if bps.size() > 1:  # the deltas are out, but the model only changes at step()
            assert all(torch.equal(p, before[n]) for n, p in parameters(model).items())
        optimizer.step()
        assert_same_everywhere(model, reference.step(step), f"{tag} step {step}")


def sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def adam(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=0.05, weight_decay=0.01)


def pairwise_tree(tensors: List[torch.Tensor]) -> torch.Tensor:
    """Horovod's formula in float64, written again here (the training checks use byteps' adasum_tree)."""
    level = [t.double() for t in tensors]
    while len(level) > 1:
        pairs = [(level[i], level[i + 1]) for i in range(0, len(level), 2)]
        level = [(1 - (a * b).sum() / (2 * (a * a).sum())) * a + (1 - (a * b).sum() / (2 * (b * b).sum())) * b
                 for a, b in pairs]
    return level[0]


def check_allreduce_adasum() -> None:
    """allreduce(op=Adasum) of each rank's tensor against the pairwise tree of every rank's, the same bits on
    every rank; in place and asynchronous too."""
    def mine(rank: int, shape, dtype) -> torch.Tensor:
        k = torch.arange(int(torch.Size(shape).numel()), dtype=torch.float64).reshape(shape)
        return (torch.cos(k * (rank + 1)) * (rank + 1) + 0.1 * rank).to(dtype)

    for shape, dtype, rtol in (((7,), torch.float32, 1e-5), ((3, 4), torch.float64, 1e-12),
                               ((2, 3, 5), torch.float16, 5e-3), ((20000,), torch.float32, 1e-5)):
        tag = f"{str(dtype)[6:]}.{len(shape)}d.{shape[0]}"
        want = pairwise_tree([mine(r, shape, dtype) for r in range(bps.size())])
        got = bps.allreduce(mine(bps.rank(), shape, dtype), op=bps.Adasum, name=f"adasum.{tag}")
        assert got.dtype == dtype and got.shape == shape, (got.dtype, got.shape)
        assert torch.allclose(got.double(), want, rtol=rtol, atol=rtol), f"{tag}: {got} != {want}"
        inplace = mine(bps.rank(), shape, dtype)
        assert bps.synchronize(bps.allreduce_async_(inplace, op=bps.Adasum, name=f"adasum_.{tag}")) is inplace
        assert torch.equal(inplace, got), tag
        everyone = bps.allgather_object(got.numpy().tobytes(), name=f"adasum.{tag}.agree")
        assert all(other == everyone[0] for other in everyone), f"{tag}: the ranks' results differ"


def check_passes_and_errors() -> None:
    model = make_net()
    optimizer = bps.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(), op=bps.Adasum,
                                         backward_passes_per_step=2)
    optimizer.zero_grad()
    loss_of(model, bps.rank(), 0).backward()
    if bps.size() > 1:
        expect_error(ValueError, "before optimizer.step()", optimizer.zero_grad)
    loss_of(model, bps.rank(), 1).backward()
    if bps.size() > 1:
        expect_error(RuntimeError, "backward_passes_per_step=2", lambda: loss_of(model, bps.rank(), 2).backward())
    optimizer.step()
    optimizer.synchronize()  # nothing to do, as in Horovod
    if bps.size() > 1:
        expect_error(NotImplementedError, "call step() alone", optimizer.skip_synchronize)
    else:  # Horovod's plain optimizer for one worker: nothing to skip
        with optimizer.skip_synchronize():
            optimizer.step()
    expect_error(ValueError, "already a DistributedOptimizer", lambda: bps.DistributedOptimizer(optimizer,
                                                                                                op=bps.Adasum))


def check_refusals() -> None:
    def wrap(optimizer=None, **kwargs):
        model = make_net()
        return bps.DistributedOptimizer(sgd(model) if optimizer is None else optimizer, op=bps.Adasum, **kwargs)

    expect_error(ValueError, "only supported with op=Average", lambda: wrap(gradient_predivide_factor=2.0))
    expect_error(NotImplementedError, "drop process_set", lambda: wrap(process_set=bps.ProcessSet([0])))
    expect_error(ValueError, "drop compression_params", lambda: wrap(compression_params={"compressor": "onebit"}))
    expect_error(ValueError, "drop sparse_as_dense", lambda: wrap(sparse_as_dense=True))
    expect_error(ValueError, "use op=Average with LBFGS",
                 lambda: wrap(torch.optim.LBFGS(make_net().parameters())))
    expect_error(ValueError, "must be a Compressor", lambda: wrap(compression="fp16"))


def check_one_refusal(kind: type, text: str) -> None:
    model = make_net()
    message = expect_error(kind, text, lambda: bps.DistributedOptimizer(sgd(model), op=bps.Adasum))
    assert "\n" not in message, message


def main() -> None:
    checks.run("refused before init()", lambda: expect_error(
        ValueError, "call bps.init() first", lambda: bps.DistributedOptimizer(sgd(make_net()), op=bps.Adasum)))
    bps.init()
    size = bps.size()
    if api.membership_epoch() is not None:
        checks.run("refused in an elastic job", lambda: check_one_refusal(NotImplementedError, "elastic jobs"))
    elif os.environ.get("BYTEPS_ENABLE_ASYNC") == "1":
        checks.run("refused in asynchronous training", lambda: check_one_refusal(ValueError, "BYTEPS_ENABLE_ASYNC"))
    elif os.environ.get("BYTEPS_BACKUP_WORKERS"):
        checks.run("refused with backup workers", lambda: check_one_refusal(ValueError, "BYTEPS_BACKUP_WORKERS"))
    elif size & (size - 1):
        checks.run("refused with a non-power-of-two number of workers",
                   lambda: check_one_refusal(NotImplementedError, f"this job has {size}: run 1, 2, 4"))
    else:
        checks.run("allreduce(op=Adasum)", check_allreduce_adasum)
        checks.run("sgd with momentum", lambda: train("sgd", sgd))
        checks.run("adam", lambda: train("adam", adam))
        checks.run("backward_passes_per_step=2", lambda: train("passes", adam, passes=2))
        checks.run("a branch unused on rank 1", lambda: train("unused", sgd, use_c=lambda r: r != 1))
        checks.run("fp16 compression", lambda: train("fp16", sgd, compression=bps.Compression.fp16,
                                                     to_wire=lambda t: t.half()))
        checks.run("synchronize() before step()", lambda: train("sync", sgd, between=lambda o: o.synchronize()))
        checks.run("backward_passes_per_step, zero_grad, skip_synchronize", check_passes_and_errors)
        checks.run("refusals", check_refusals)
    bps.shutdown()
    checks.done()


if __name__ == "__main__":
    main()
