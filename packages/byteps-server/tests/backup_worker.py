"""Worker of the backup-workers test: every rank averages values that name their round and rank.

Usage: python backup_worker.py ROUNDS SLOW_RANK SLEEP_S [skip]
Rank r pushes ``1000 * round + 10 ** r`` (float64) each round; SLOW_RANK
sleeps SLEEP_S before each push. With ``skip`` a rank that learns it is
behind skips the rounds that closed without it (no sleep, no push: it pulls
their sums, ``SKIPPED`` on its line). With 3 workers and BYTEPS_BACKUP_WORKERS=1
every sum holds two ranks' pushes of one round, so twice the average is
``2000 * t + 10 ** a + 10 ** b``: the round ``t`` and the ranks ``a``, ``b``
it holds can be read back, and a push of another round would show. Prints
one ``ROUND r GOT t RANKS a,b`` line per round, then the time it took.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import byteps.common as bps
from byteps.common.api import worker as current_worker  # byteps.common.worker is the submodule

PAIRS = {10 ** a + 10 ** b: (a, b) for a in range(3) for b in range(a + 1, 3)}


def decode(average: float):
    doubled = int(round(2 * average))
    for remainder, ranks in PAIRS.items():
        if (doubled - remainder) % 2000 == 0:
            return (doubled - remainder) // 2000, ranks
    raise AssertionError(f"the sum {doubled} is not two ranks' pushes of one round")


def main() -> None:
    rounds, slow_rank, sleep_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    skip = sys.argv[4:] == ["skip"]
    bps.init()
    worker = current_worker()
    rank, behind = bps.rank(), 0
    started = time.monotonic()
    for round_ in range(rounds):
        value = np.full(1000, 1000.0 * round_ + 10 ** rank)
        if skip and behind > 0:
            with worker.skipping_round():
                bps.push_pull(value, name="tagged", average=True)
        else:
            if rank == slow_rank:
                time.sleep(sleep_s)
            bps.push_pull(value, name="tagged", average=True)
        assert np.all(value == value[0])
        got, ranks = decode(value[0])
        print(f"ROUND {round_} GOT {got} RANKS {ranks[0]},{ranks[1]}{' SKIPPED' if behind > 0 else ''}",
              flush=True)
        behind = worker.take_rounds_behind()
    print(f"rank {rank} took {time.monotonic() - started:.2f} s", flush=True)
    bps.shutdown()


if __name__ == "__main__":
    main()
