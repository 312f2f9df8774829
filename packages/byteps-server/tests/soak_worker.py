"""Soak worker: ROUNDS rounds of a TENSORS-tensor model; prints its RSS and open fds at checkpoints."""

import os
import sys
import time

import numpy as np

import byteps.common as bps


def rss_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def main() -> None:
    rounds, tensors, warmup = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    bps.init()
    rank, size = bps.rank(), bps.size()
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 20_000, size=tensors)
    grads = [np.full(int(n), rank + 1, dtype=np.float32) for n in sizes]
    names = [f"layer{i}.grad" for i in range(tensors)]
    for name in names:
        bps.declare(name)
    expected = size * (size + 1) / 2
    for round_ in range(1, rounds + 1):
        for g in grads:
            g.fill(rank + 1)
        handles = [bps.push_pull_async(g, name=n, average=False) for g, n in zip(grads, names)]
        for h in handles:
            out = bps.synchronize(h)
            if out[0] != expected or out[-1] != expected:
                print(f"WRONG SUM at round {round_}", flush=True)
                sys.exit(1)
        if round_ in (warmup, rounds):
            print(f"CHECKPOINT {round_} rss_kib={rss_kib()} fds={len(os.listdir('/proc/self/fd'))}", flush=True)
            time.sleep(1.0)  # lets the test sample the servers at the same point
    bps.shutdown()


if __name__ == "__main__":
    main()
