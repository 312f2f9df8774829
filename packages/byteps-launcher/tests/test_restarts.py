"""bpslaunch --max-restarts: the whole job again after a failure, with BYTEPS_RESTART_COUNT, and no orphans.

The jobs are real: a scheduler and two local worker processes summing in
shared memory (``-np 2``) run byteps.common's push_pull; a worker that fails
does so with ``os._exit`` after it joined, so the others are torn down as in
any failure, and every pid each attempt started is checked dead afterwards.
"""

from __future__ import annotations

import pytest
from launcher_harness import PY, ROLE_WORKER_ENV

from byteps.testkit import wait_until_dead

#: A worker: records its pid, joins the job, fails (exit 3) while BYTEPS_RESTART_COUNT < FAILURES on local rank 1.
WORKER = r"""
import os, sys
import numpy as np
import byteps.common as bps
attempt = int(os.environ["BYTEPS_RESTART_COUNT"])
with open(os.path.join(os.environ["BPSTEST_PIDDIR"], "pids"), "a") as pids:
    pids.write(f"{os.getpid()}\n")
bps.init()
x = np.ones(1000, np.float32) * (bps.rank() + 1)
bps.push_pull(x, "x", average=False)
print(f"rank {bps.rank()} attempt {attempt}: sum {x[0]:g}", flush=True)
if attempt < int(sys.argv[1]) and bps.local_rank() == 1:
    os._exit(3)
bps.shutdown()
"""


def run(job, failures, max_restarts, timeout=60):
    args = ["-np", "2", "--grace-period", "1", "--max-restarts", str(max_restarts), "--", PY, "-c", WORKER,
            str(failures)]
    return job.run(args, timeout=timeout)


def test_a_failing_worker_is_restarted_with_the_next_restart_count(job):
    rc, out, err = run(job, failures=1, max_restarts=1)
    assert rc == 0, err
    assert "rank 1 attempt 0: sum 3" in out and "rank 1 attempt 1: sum 3" in out, out
    assert "rank 0 attempt 1: sum 3" in out, out
    assert ("bpslaunch: attempt 1 of 2 failed (worker 1 (local rank 1) exited with code 3; exit status 3); "
            "restarting the job with BYTEPS_RESTART_COUNT=1") in err, err
    assert "job done in" in err and "; restarted 1 time" in err, err
    pids = job.pids()
    assert len(pids) == 4  # two workers per attempt
    assert wait_until_dead(pids, timeout=2) == []


def test_the_exit_status_is_the_last_attempts(job):
    rc, out, err = run(job, failures=5, max_restarts=2)
    assert rc == 3, err
    assert "attempt 2 of 3 failed" in err and "attempt 3 of 3" not in err, err
    assert "rank 1 attempt 2: sum 3" in out, out
    assert "job failed after" in err and "with exit status 3; restarted 2 times" in err, err
    assert wait_until_dead(job.pids(), timeout=2) == []


def test_without_max_restarts_a_failure_ends_the_job(job):
    rc, out, err = run(job, failures=1, max_restarts=0)
    assert rc == 3, err
    assert "restarting" not in err and "attempt 1" not in out, out


def test_role_mode_refuses_restarts_it_cannot_do(job):
    rc, _, err = job.run(["--max-restarts", "1", "--", PY, "-c", "pass"], env=job.env(**ROLE_WORKER_ENV))
    assert rc == 2
    assert "--max-restarts restarts the whole job, which only a bpslaunch that starts all of it can do" in err
    assert "this one runs in role mode" in err, err


@pytest.mark.parametrize("value", ["-1", "two"])
def test_a_bad_count_is_a_usage_error(job, value):
    rc, _, err = job.run(["--max-restarts", value, "--", PY, "-c", "pass"])
    assert rc == 2
    assert "--max-restarts" in err, err
