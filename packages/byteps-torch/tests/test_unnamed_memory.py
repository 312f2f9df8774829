"""Per-step unnamed allreduces keep memory flat: 30,000 of them on 2 workers and a server (a real job).

Unnamed ops take one of 16 default names per op (docs/decisions.md), these
blocking ones always the first, so the servers' keys and the workers'
tensors stop growing after the first call. Without the window every call declared a new tensor, which
the server kept for the job's life (a few kB each: 27,000 calls between the
samples grow it by tens of MB, several times the slack). The 100,000-call
run (three times the CI minutes) is tests/matrix/test_unnamed_memory_100k.py.
"""

from __future__ import annotations

import os
import sys

from byteps.testkit import run_job

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "unnamed_memory.py")
#: Allowed growth of resident memory between a tenth of the calls and all of them (allocator noise, logs).
SLACK_KB = 8 * 1024


def test_memory_stays_flat_over_30000_unnamed_allreduces():
    memory_stays_flat(30_000)


def memory_stays_flat(calls: int) -> None:
    result = run_job([sys.executable, SCRIPT], num_workers=2, num_servers=1, timeout=600,
                     env={"UNNAMED_CALLS": str(calls)})
    assert not result.timed_out and all(code == 0 for code in result.codes.values()), result.failures()
    line = next(line for line in result.outputs["worker0"].splitlines() if line.startswith("MEMORY"))
    _, _, worker_before, worker_after, _, server_before, server_after = line.split()
    assert int(worker_after) - int(worker_before) < SLACK_KB, line
    assert int(server_after) - int(server_before) < SLACK_KB, line
    assert "ALL OK 1" in result.outputs["worker1"]
