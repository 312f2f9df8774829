"""Worker of the restart tests: 20 deterministic SGD steps that checkpoint every step and resume on start.

Usage: python restart_training.py CHECKPOINT_DIR CRASH_AT_STEP
In the job's first attempt (BYTEPS_RESTART_COUNT=0) rank 1 exits with
status 5 right after step CRASH_AT_STEP (-1: never). Rank 0 prints the
final weights as ``WEIGHTS [...]`` and each attempt's first step as
``START <step> attempt <n>``.
"""

from __future__ import annotations

import json
import os
import sys

import torch

import byteps.torch as bps

STEPS = 20


def main() -> None:
    directory, crash_at = sys.argv[1], int(sys.argv[2])
    attempt = int(os.environ["BYTEPS_RESTART_COUNT"])
    bps.init()
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(64, 8, generator=generator)
    targets = inputs @ torch.arange(8, dtype=torch.float32).unsqueeze(1) + 0.5
    model = torch.nn.Linear(8, 1)
    optimizer = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9),
                                         named_parameters=model.named_parameters())
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bps.broadcast_optimizer_state(optimizer, root_rank=0)
    resumed = bps.load_checkpoint(directory, model, optimizer)
    first = resumed["step"] + 1 if resumed else 1
    if bps.rank() == 0:
        print(f"START {first} attempt {attempt}", flush=True)
    for step in range(first, STEPS + 1):
        rows = slice((step * 8 + bps.rank() * 4) % 64, (step * 8 + bps.rank() * 4) % 64 + 4)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(inputs[rows]), targets[rows]).backward()
        optimizer.step()
        bps.save_checkpoint(directory, model, optimizer, step=step)
        if step == crash_at and attempt == 0 and bps.rank() == 1:
            os._exit(5)
    if bps.rank() == 0:
        weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        print("WEIGHTS " + json.dumps(weights.tolist()), flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
