"""Worker of the restart tests: 20 deterministic SGD steps that checkpoint every step and resume on start.

Usage: python restart_training.py CHECKPOINT_DIR CRASH_AT_STEP [held]
In the job's first attempt (BYTEPS_RESTART_COUNT=0) rank 1 exits with
status 5 right after step CRASH_AT_STEP (-1: never). Rank 0 prints the
final weights as ``WEIGHTS [...]`` and each attempt's first step as
``START <step> attempt <n>``. ``held``: the inputs also go through a
ServerEmbedding (Adagrad on the servers), whose rows the checkpoint keeps
on the servers' side and the weights printed include.
"""

from __future__ import annotations

import json
import os
import sys

import torch

import byteps.torch as bps

STEPS = 20


class Model(torch.nn.Module):
    def __init__(self, held: bool) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 1)
        self.emb = bps.ServerEmbedding(30, 8, name="restart.emb", optimizer="adagrad", lr=0.1, seed=3,
                                       init_std=0.5) if held else None

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if self.emb is not None:
            x = x + self.emb(ids).sum(1)
        return self.linear(x)


def main() -> None:
    directory, crash_at = sys.argv[1], int(sys.argv[2])
    held = sys.argv[3:] == ["held"]
    attempt = int(os.environ["BYTEPS_RESTART_COUNT"])
    bps.init()
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(64, 8, generator=generator)
    ids = torch.randint(0, 30, (64, 3), generator=generator)
    targets = inputs @ torch.arange(8, dtype=torch.float32).unsqueeze(1) + 0.5
    model = Model(held)
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
        torch.nn.functional.mse_loss(model(inputs[rows], ids[rows]), targets[rows]).backward()
        optimizer.step()
        bps.save_checkpoint(directory, model, optimizer, step=step)
        if step == crash_at and attempt == 0 and bps.rank() == 1:
            os._exit(5)
    if bps.rank() == 0:
        weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        if held:
            weights = torch.cat([weights, model.emb.lookup(torch.arange(30)).reshape(-1)])
        print("WEIGHTS " + json.dumps(weights.tolist()), flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
