"""Worker of test_join_job.py: hvd.join() for uneven data over the framework-neutral core, checked against numpy.

Rank r has ``3 + 3 * r`` batches, so ranks run out of data at different
steps, and with two processes per machine a local root joins while its
peer still pushes (it stands in for it). Each step every rank pushes a
tensor that says which machine it is on and a count of its batch:

* synchronous (no backup workers): the average over all n ranks, joined
  ranks as zeros, must equal the numpy reference exactly;
* with backup workers (quorum q machines): rounds close without the late
  machines, so the sum says which ranks it holds (rank r pushes 2^r):
  every running rank of exactly min(q, machines still running) machines,
  and every rank saw the same sequence of sums.

Then join() returns the last rank to join on every rank, and a tensor first
used after the join sums as usual. Prints ``JOIN OK rank R`` at the end.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import byteps.common as bps
from byteps.common import PushPullOptions
from byteps.common.api import worker


def batches(rank: int) -> int:
    return 3 + 3 * rank


def main() -> None:
    bps.init()
    me, n = bps.rank(), bps.size()
    local = worker().local_size
    machines = n // local
    backup = worker().config.backup_workers
    quorum = machines - backup
    steps = max(batches(r) for r in range(n))
    seen = np.zeros(steps, dtype=np.float64)
    for step in range(batches(me)):
        running = [r for r in range(n) if batches(r) > step]
        if backup:
            x = np.full(6, float(1 << me), dtype=np.float64)
            y = bps.push_pull(x, name="grad")  # averaged over quorum * local processes
            held = int(round(y[0] * quorum * local))  # the ranks whose pushes the round holds, as bits
            live = {r // local for r in running}
            members = {r // local for r in range(n) if held >> r & 1}
            assert held < 1 << n and members <= live, (step, held, live)
            assert {r for r in range(n) if held >> r & 1} == {r for r in running if r // local in members}, \
                (step, held, running)
            assert len(members) == min(quorum, len(live)), (step, held, live, quorum)
            seen[step] = held
        else:
            x = np.full((5, 3), float((me + 1) * (step + 1)), dtype=np.float64)
            y = bps.push_pull(x, name="grad")
            want = sum((r + 1) * (step + 1) for r in running) / n
            assert np.array_equal(y, np.full((5, 3), want)), (step, y[0, 0], want)
        counts = np.array([step + 1, me + 1], dtype=np.int64)
        bps.push_pull(counts, name="counts", average=False)
        if not backup:
            assert counts.tolist() == [(step + 1) * len(running), sum(r + 1 for r in running)], (step, counts)
    if me == n - 1:
        time.sleep(0.5)  # steps take milliseconds here: make sure the rank with the most batches joins last
    last, _ = worker().join()
    assert last == n - 1, f"join() returned {last}; rank {n - 1} has the most batches and joined last"
    if backup:  # every rank saw the same closed rounds: each writes what it saw at its own rows
        table = np.zeros((n, steps), dtype=np.float64)
        table[me] = seen
        worker().push_pull(table, "seen", PushPullOptions(average=False))
        for r in range(n):
            count = batches(r)
            assert np.array_equal(table[r, :count], table[n - 1, :count]), (r, table[r], table[n - 1])
    after = np.full(4, float(me), dtype=np.float32)
    bps.push_pull(after, name="first.after.join", average=False)
    assert np.array_equal(after, np.full(4, float(sum(range(n))), dtype=np.float32)), after
    print(f"JOIN OK rank {me} of {n}", flush=True)
    bps.shutdown()


if __name__ == "__main__":
    sys.exit(main())
