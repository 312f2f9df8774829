"""DistributedOptimizer with backup workers: the last machine is slow and skips the rounds that closed without it.

Usage: python backup_training.py STEPS SLEEP_S OUT_DIR [WIDTH]
Every rank trains a small model (hidden WIDTH, 16 by default; 4096 makes
the first weight 128 KiB, which goes to co-located servers through shared
memory) with momentum SGD on its own data for STEPS batches, asking ``optimizer.skip_step()`` first; the ranks of the
last machine (the last rank, with one process per machine) sleep SLEEP_S
in each batch they compute. Prints one JSON line per rank: the batches it
computed, its time, and its parameters (all ranks must hold the same ones).
Writes OUT_DIR/rank<r>.pkl: the parameters it started from, for each step
whether it computed it, its own gradient (computed steps; from a copy of
the model that no optimizer hooks, as the push_pull overwrites ``p.grad``
in place) and the averaged gradient it stepped with (``p.grad`` after the
step or the skip), and its final parameters.
"""

from __future__ import annotations

import copy
import json
import pickle
import sys
import time

import torch

import byteps.torch as bps

LR, MOMENTUM = 0.1, 0.9


def main() -> None:
    steps, sleep_s, out_dir = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    width = int(sys.argv[4]) if len(sys.argv) > 4 else 16
    bps.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.Tanh(), torch.nn.Linear(width, 2))
    shadow = copy.deepcopy(model)  # made before the optimizer hooks model's parameters
    optimizer = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM),
                                         named_parameters=model.named_parameters())

    def loss_of(net, x):
        return torch.nn.functional.cross_entropy(net(x), (x[:, 0] > 0).long())

    def named(values):
        return {name: value.detach().numpy().copy() for name, value in values}

    generator = torch.Generator().manual_seed(bps.rank())
    slow = bps.rank() // bps.local_size() == bps.size() // bps.local_size() - 1  # the last machine's ranks
    initial = named(model.named_parameters())
    computed, local, applied, started = [], [], [], time.monotonic()
    for _ in range(steps):
        x = torch.randn(16, 8, generator=generator)
        if optimizer.skip_step():
            computed.append(False)
            local.append(None)
        else:
            computed.append(True)
            if slow:
                time.sleep(sleep_s)
            shadow.load_state_dict(model.state_dict())
            shadow.zero_grad()
            loss_of(shadow, x).backward()
            local.append(named((name, p.grad) for name, p in shadow.named_parameters()))
            optimizer.zero_grad()
            loss_of(model, x).backward()
            optimizer.step()
        applied.append(named((name, p.grad) for name, p in model.named_parameters()))
    seconds = time.monotonic() - started
    with open(f"{out_dir}/rank{bps.rank()}.pkl", "wb") as out:
        pickle.dump({"initial": initial, "computed": computed, "local": local, "applied": applied,
                     "final": named(model.named_parameters()), "local_size": bps.local_size()}, out)
    parameters = [round(float(v), 6) for p in model.parameters() for v in p.detach().flatten()[:4]]
    print("RESULT " + json.dumps({"rank": bps.rank(), "computed": sum(computed), "seconds": seconds,
                                  "parameters": parameters}), flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
