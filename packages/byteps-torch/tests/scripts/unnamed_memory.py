"""Worker script: 30,000 unnamed allreduces of a scalar (a metric averaged every step, Horovod style),
while worker and server memory must stay flat.

Run with 2 workers and 1 server on this machine. Rank 0 samples its own
resident memory and the server's (found in /proc by the job's scheduler
port) after a warm-up and at the end, and prints ``MEMORY worker <kB>
<kB> server <kB> <kB>``; every rank checks its results as it goes.
Prints ``ALL OK 1`` when done.
"""

from __future__ import annotations

import os

import torch

import byteps.torch as bps

CALLS = int(os.environ.get("UNNAMED_CALLS", "30000"))
WARM_UP = CALLS // 10


def rss_kb(pid="self"):
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def server_pid():
    """The server of this job: DMLC_ROLE=server with our scheduler port in its environment."""
    port = os.environ["DMLC_PS_ROOT_PORT"].encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                variables = environ.read().split(b"\0")
        except OSError:
            continue
        if b"DMLC_ROLE=server" in variables and b"DMLC_PS_ROOT_PORT=" + port in variables:
            return int(entry)
    raise RuntimeError("no server process of this job found")


def main():
    bps.init()
    r, n = bps.rank(), bps.size()
    want = float(sum(range(n)))
    server = server_pid() if r == 0 else None
    samples = []
    for call in range(CALLS):
        loss = torch.tensor(float(r))
        got = bps.allreduce(loss, op=bps.Sum)                   # unnamed, as metric averaging does
        if got.item() != want:
            raise AssertionError(f"call {call}: {got.item()} != {want}")
        if r == 0 and call + 1 in (WARM_UP, CALLS):
            samples.append((rss_kb(), rss_kb(server)))
    if r == 0:
        (worker_before, server_before), (worker_after, server_after) = samples
        print(f"MEMORY worker {worker_before} {worker_after} server {server_before} {server_after}", flush=True)
    bps.shutdown()
    print("ALL OK 1", flush=True)


if __name__ == "__main__":
    main()
