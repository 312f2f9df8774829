"""DistributedOptimizer with backup workers: the last machine is slow and skips the rounds that closed without it.

Usage: python backup_training.py STEPS SLEEP_S
Every rank trains a small model on its own data for STEPS batches, asking
``optimizer.skip_step()`` first; the ranks of the last machine (the last
rank, with one process per machine) sleep SLEEP_S in each batch they
compute. Prints one JSON line per rank: the batches it computed,
its time, and its parameters (all ranks must hold the same ones).
"""

from __future__ import annotations

import json
import sys
import time

import torch

import byteps.torch as bps


def main() -> None:
    steps, sleep_s = int(sys.argv[1]), float(sys.argv[2])
    bps.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    optimizer = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                         named_parameters=model.named_parameters())
    generator = torch.Generator().manual_seed(bps.rank())
    slow = bps.rank() // bps.local_size() == bps.size() // bps.local_size() - 1  # the last machine's ranks
    computed, started = 0, time.monotonic()
    for _ in range(steps):
        x = torch.randn(16, 8, generator=generator)
        if optimizer.skip_step():
            continue
        computed += 1
        if slow:
            time.sleep(sleep_s)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
        optimizer.step()
    parameters = [round(float(v), 6) for p in model.parameters() for v in p.detach().flatten()[:4]]
    print("RESULT " + json.dumps({"rank": bps.rank(), "computed": computed, "seconds": time.monotonic() - started,
                                  "parameters": parameters}), flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
