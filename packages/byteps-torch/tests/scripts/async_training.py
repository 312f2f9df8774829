"""Asynchronous training (BYTEPS_ENABLE_ASYNC=1) on every rank: timing, exactly-once, the servers' store.

Usage: python async_training.py OUT_DIR STEPS SLOW_RANK SLEEP_S [WIDTH]
Each rank trains a small model (hidden WIDTH, 8 by default; 2048 makes the
first weight 128 KiB, which goes to co-located servers through shared
memory) on its own data with SGD; SLOW_RANK sleeps SLEEP_S per step.
Every delta the exchange pushes is recorded. After the loop a barrier,
then one exchange of a zero delta returns the servers' store, holding
every rank's every delta. Each rank writes OUT_DIR/rank<r>.pt:
its initial parameters (after the first broadcast), the sum of its deltas,
the final store, the time of each completed step and its count of pushes.
"""

from __future__ import annotations

import sys
import time

import torch

import byteps.torch as bps


def main() -> None:
    out_dir, steps, slow_rank, sleep_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    width = int(sys.argv[5]) if len(sys.argv) > 5 else 8
    bps.init()
    torch.manual_seed(1234 + bps.rank())  # different initial weights: the broadcast makes them rank 0's
    model = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.Tanh(), torch.nn.Linear(width, 2))
    optimizer = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5),
                                         named_parameters=model.named_parameters())
    exchange = getattr(optimizer, "_exchange", None)  # None: synchronous training (the comparison)
    deltas, pushes = {}, [0]
    if exchange is not None:
        record_deltas(exchange, deltas, pushes)
    generator = torch.Generator().manual_seed(bps.rank())
    initial, times, stamps, started = None, [], [], time.monotonic()
    for step in range(steps):
        x = torch.randn(32, 16, generator=generator)
        y = (x[:, 0] > 0).long()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if step == 0 and exchange is not None:  # the first step broadcasts rank 0's parameters into the store
            exchange.start({name: p.data for name, p in model.named_parameters()})
            initial = {name: p.detach().double().clone() for name, p in model.named_parameters()}
        if bps.rank() == slow_rank:
            time.sleep(sleep_s)
        optimizer.step()
        stamps.append(time.monotonic())  # one clock for every process of this machine: ranks compare
        times.append(stamps[-1] - started)
        print(f"step {step + 1} done at {times[-1]:.2f} s", flush=True)
    bps.barrier()
    tensors = {name: p.data for name, p in model.named_parameters()}
    if exchange is not None:
        exchange.exchange(exchange.snapshot(tensors), tensors)  # a zero delta: the store with every delta in it
    final = {name: p.detach().double().clone() for name, p in model.named_parameters()}
    torch.save({"initial": initial, "deltas": deltas, "final": final, "times": times, "stamps": stamps,
                "pushes": pushes[0], "names": list(exchange.names) if exchange is not None else []},
               f"{out_dir}/rank{bps.rank()}.pt")
    print(f"async rank {bps.rank()} OK", flush=True)
    bps.shutdown()


def record_deltas(exchange, deltas, pushes) -> None:
    """Wrap the exchange's subtraction: every delta it pushes is summed into ``deltas`` and counted."""
    subtract = exchange.ops.subtract

    def recording_subtract(after, before):
        delta = subtract(after, before)
        pushes[0] += 1
        name = exchange.names[(pushes[0] - 1) % len(exchange.names)]  # the exchange goes in name order
        deltas[name] = deltas.get(name, 0) + delta.double()
        return delta

    exchange.ops = exchange.ops.__class__(exchange.ops.copy, recording_subtract, exchange.ops.zeros_like)


if __name__ == "__main__":
    main()
