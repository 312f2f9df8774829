"""Worker of test_backup_local.py: backup workers with two processes per machine, the slow machine skipping.

Usage: python backup_local_worker.py ROUNDS SLEEP_S
Three machines of two processes, BYTEPS_BACKUP_WORKERS=1: rounds close at
two machines' pushes. Every process of machine m pushes ``1000 * round +
10 ** m`` (float64) each round; both processes of the last machine sleep
SLEEP_S before each round they compute, and skip (``skipping_round``) the
rounds they learn closed without their machine. A sum holds two machines'
local sums of one round, averaged over 2 machines x 2 processes, so twice
the average is ``2000 * t + 10 ** a + 10 ** b``: the round t and the
machines a, b it holds read back exactly, and a push of another round, a
half-summed machine or a machine counted twice would show. Prints one
``ROUND r GOT t MACHINES a,b [SKIPPED]`` line per round.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import byteps.common as bps
from byteps.common.api import worker as current_worker

PAIRS = {10 ** a + 10 ** b: (a, b) for a in range(3) for b in range(a + 1, 3)}


def decode(average: float):
    doubled = int(round(2 * average))
    for remainder, machines in PAIRS.items():
        if (doubled - remainder) % 2000 == 0:
            return (doubled - remainder) // 2000, machines
    raise AssertionError(f"the sum {doubled} is not two machines' pushes of one round")


def main() -> None:
    rounds, sleep_s = int(sys.argv[1]), float(sys.argv[2])
    bps.init()
    worker = current_worker()
    machine = bps.rank() // bps.local_size()
    slow = machine == bps.size() // bps.local_size() - 1
    behind = 0
    for round_ in range(rounds):
        value = np.full(1000, 1000.0 * round_ + 10 ** machine)
        if behind > 0:
            with worker.skipping_round():
                bps.push_pull(value, name="tagged", average=True)
        else:
            if slow:
                time.sleep(sleep_s)
            bps.push_pull(value, name="tagged", average=True)
        assert np.all(value == value[0])
        got, machines = decode(value[0])
        print(f"ROUND {round_} GOT {got} MACHINES {machines[0]},{machines[1]}{' SKIPPED' if behind > 0 else ''}",
              flush=True)
        behind = worker.take_rounds_behind()
    bps.shutdown()


if __name__ == "__main__":
    main()
