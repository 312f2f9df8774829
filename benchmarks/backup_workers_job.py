"""One worker of bench_backup_workers.py: the digits example's model and data, with emulated compute.

Usage (under bpslaunch): python backup_workers_job.py --step-ms 20 --slowdown 3 --straggler random|fixed [--skip]
Each step first "computes" for --step-ms (a sleep: the machine has too few
cores to make three workers' real compute the thing measured); the
straggler of the step takes --slowdown times as long. ``random``: a
different worker each step (the same choice on every rank, from the step
number), as stragglers come and go on a shared cluster; ``fixed``: the last
rank is always the straggler. With --skip the loop asks
``optimizer.skip_step()`` first, so a worker that fell behind skips the
batches of rounds that closed without it. Trains --epochs over the
digits, then every rank prints its wall time, held-out accuracy, steps
computed and a checksum of its parameters as one JSON line.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "torch"))
from backup_workers_contract import emulate_compute, parse_args, report  # noqa: E402
from train_digits import DigitsNet, evaluate, load_data  # noqa: E402

import byteps.torch as bps  # noqa: E402


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    bps.init()
    torch.manual_seed(bps.rank())
    torch.set_num_threads(1)
    train_set, test_set = load_data(0)
    sampler = DistributedSampler(train_set, num_replicas=bps.size(), rank=bps.rank(), shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=32, sampler=sampler)
    model = DigitsNet()
    optimizer = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05 * bps.size(), momentum=0.9),
                                         named_parameters=model.named_parameters())
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    started, step, computed = time.perf_counter(), 0, 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for images, labels in loader:
            if args.skip and optimizer.skip_step():
                step += 1
                continue
            computed += 1
            emulate_compute(step, bps.rank(), bps.size(), args)
            optimizer.zero_grad()
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()
            step += 1
    wall = time.perf_counter() - started
    accuracy = evaluate(model, test_set, torch.device("cpu"))
    # Backup workers keep the replicas identical: every rank applies every round's average.
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    report(bps.rank(), wall, accuracy, step, computed, checksum)
    bps.shutdown()


if __name__ == "__main__":
    main()
