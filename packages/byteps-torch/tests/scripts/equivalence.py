"""Data-parallel training equals single-process training on the whole batch.

Every step, rank r of W trains on the r-th of W equal slices of a fixed
batch; with gradients averaged, 20 steps of SGD with momentum must give the
parameters that one process gets on the whole batch. Each rank computes
that single-process reference itself and compares, for three ways of
averaging: DistributedOptimizer, byteps' DistributedDataParallel, and
torch's DistributedDataParallel with the byteps communication hook.

Ranks start from different random weights on purpose: each way must
broadcast rank 0's.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from check_runner import assert_close, check

import byteps.torch as bps
from byteps.torch.parallel import DistributedDataParallel, byteps_hook

STEPS = 20
BATCH = 16
LR, MOMENTUM = 0.05, 0.9


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(4, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return self.fc(x.flatten(1))


def make_model(rank: int) -> SmallCNN:
    torch.manual_seed(100 + rank)
    return SmallCNN()


def full_batch(step: int) -> tuple:
    generator = torch.Generator().manual_seed(step)
    return torch.randn(BATCH, 1, 8, 8, generator=generator), torch.randint(0, 10, (BATCH,), generator=generator)


def my_slice(step: int) -> tuple:
    images, labels = full_batch(step)
    return images.chunk(bps.size())[bps.rank()], labels.chunk(bps.size())[bps.rank()]


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch_of) -> None:
    for step in range(STEPS):
        images, labels = batch_of(step)
        optimizer.zero_grad()
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()


def reference() -> dict:
    model = make_model(0)
    train(model, torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM), full_batch)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def compare(model: torch.nn.Module, expected: dict, what: str) -> None:
    worst = 0.0
    for name, p in model.named_parameters():
        assert_close(p.detach(), expected[name], f"{what}: {name}")
        worst = max(worst, float((p.detach() - expected[name]).abs().max()))
    print(f"{what}: largest difference from the single-process reference {worst:.2e}", flush=True)


def main() -> None:
    bps.init()
    torch.set_num_threads(1)
    assert BATCH % bps.size() == 0
    expected = reference()

    def distributed_optimizer() -> None:
        model = make_model(bps.rank())
        optimizer = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM),
                                             named_parameters=model.named_parameters())
        bps.broadcast_parameters(model.state_dict(), root_rank=0)
        bps.broadcast_optimizer_state(optimizer, root_rank=0)
        train(model, optimizer, my_slice)
        compare(model, expected, "DistributedOptimizer")

    def byteps_ddp() -> None:
        model = DistributedDataParallel(make_model(bps.rank()))
        train(model, torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM), my_slice)
        compare(model.module, expected, "byteps DistributedDataParallel")

    def native_ddp_with_hook() -> None:
        # torch's DDP needs a process group of its own; a file rendezvous in
        # the test's folder needs no port. Users would use MASTER_ADDR/PORT.
        dist.init_process_group("gloo", init_method="file://" + os.path.join(os.environ["BYTEPS_TEST_TMP"], "pg"),
                                rank=bps.rank(), world_size=bps.size())
        try:
            # tiny buckets: several per step, and torch rebuilds them after the first step
            model = torch.nn.parallel.DistributedDataParallel(make_model(bps.rank()), bucket_cap_mb=0.002)
            model.register_comm_hook(state=None, hook=byteps_hook)
            train(model, torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM), my_slice)
            compare(model.module, expected, "torch DistributedDataParallel with byteps_hook")
        finally:
            dist.destroy_process_group()

    check("distributed_optimizer", distributed_optimizer)
    check("byteps_ddp", byteps_ddp)
    check("native_ddp_with_hook", native_ddp_with_hook)
    bps.shutdown()


if __name__ == "__main__":
    main()
