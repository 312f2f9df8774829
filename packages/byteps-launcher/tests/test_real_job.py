"""bpslaunch with the real scheduler, servers and numpy workers exchanging gradients."""

from __future__ import annotations

import os
import time
from pathlib import Path

from launcher_harness import PY

from byteps.testkit import is_alive

WORKER = r"""
import os, sys, time
import numpy as np
import byteps.common as bps
bps.init()
rank, size = bps.rank(), bps.size()
with open(os.path.join(os.environ["BPSTEST_PIDDIR"], "pids"), "a") as f:
    f.write(f"{os.getpid()}\n")
if os.environ.get("FAIL_RANK") == str(rank):
    sys.exit(3)
if os.environ.get("FAIL_RANK"):
    time.sleep(60)
x = np.full(100_000, rank + 1, dtype=np.float32)
bps.push_pull(x, name="x", average=False)
assert np.all(x == size * (size + 1) / 2), x[:4]
print(f"rank {rank}: sum ok")
"""


def job_processes(piddir: Path) -> list:
    """Every live process that inherited this test's marker (servers and scheduler included)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if str(piddir).encode() in Path(f"/proc/{entry}/environ").read_bytes() and is_alive(int(entry)):
                    found.append(int(entry))
            except OSError:
                pass
    return found


def test_two_machines_of_two_processes_sum_through_two_servers(job):
    rc, out, err = job.run(["-np", "2", "--workers", "2", "--servers", "2", "--", PY, "-c", WORKER],
                           timeout=60)
    assert rc == 0, err
    for rank in range(4):
        assert f"[worker {rank}] rank {rank}: sum ok" in out
    assert job_processes(job.piddir) == []


def test_a_failing_worker_ends_a_real_job_within_seconds(job):
    started = time.monotonic()
    rc, _, err = job.run(["--workers", "3", "--servers", "1", "--", PY, "-c", WORKER],
                         env=job.env(FAIL_RANK="1"), timeout=60)
    elapsed = time.monotonic() - started
    assert rc == 3, err
    assert "worker 1 (local rank 0) exited with code 3" in err
    assert elapsed < 20, f"took {elapsed:.1f} s"
    deadline = time.monotonic() + 5
    while job_processes(job.piddir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert job_processes(job.piddir) == []


KILLED_MID_ROUND = r"""
import glob, os, signal, time
import numpy as np
import byteps.common as bps
bps.init()
job_id = os.environ["BYTEPS_JOB_ID"]
if bps.local_rank() == 1:
    time.sleep(60)  # never pushes: local rank 0's segment stays named while it waits
handle = bps.push_pull_async(np.ones(100_000, np.float32), name="x")
deadline = time.monotonic() + 20
while not glob.glob(f"/dev/shm/byteps-{job_id}-*") and time.monotonic() < deadline:
    time.sleep(0.01)
print("segments:", sorted(os.path.basename(p) for p in glob.glob(f"/dev/shm/byteps-{job_id}-*")), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_shared_memory_of_a_killed_job_is_removed(job):
    job_id = f"killed{os.getpid()}"
    rc, out, err = job.run(["-np", "2", "--", PY, "-c", KILLED_MID_ROUND],
                           env=job.env(BYTEPS_JOB_ID=job_id), timeout=60)
    assert rc == 128 + 9, err
    assert f"segments: ['byteps-{job_id}-m0-t0']" in out, out + err
    assert f"removed leftover shared memory /dev/shm/byteps-{job_id}-m0-t0" in err
    assert not list(Path("/dev/shm").glob(f"byteps-{job_id}-*"))
    assert job_processes(job.piddir) == []
