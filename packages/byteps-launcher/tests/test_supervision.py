"""Supervision with real processes: first failure ends the job, signals, no orphans ever.

Role-mode workers (``DMLC_ROLE=worker``, ``BYTEPS_LOCAL_SIZE`` local
processes) need no scheduler or server to run, which makes them the
simplest real multi-process job. Each child records its pid and that of a
background grandchild, so the tests can check in /proc that nothing of the
job survives.
"""

from __future__ import annotations

import signal
import time

import pytest
from launcher_harness import PY, RECORD_PIDS, ROLE_WORKER_ENV

from byteps.testkit import is_alive, wait_until_dead


def workers_env(job, local_size):
    return job.env(**ROLE_WORKER_ENV, BYTEPS_LOCAL_SIZE=str(local_size))


def sh(script):
    return ["--", "sh", "-c", script]


def test_first_failure_tears_down_the_job(job):
    script = RECORD_PIDS + 'if [ "$BYTEPS_LOCAL_RANK" = 1 ]; then sleep 0.5; exit 1; fi; exec sleep 60'
    started = time.monotonic()
    rc, _, err = job.run(sh(script), env=workers_env(job, 3))
    elapsed = time.monotonic() - started
    assert rc == 1
    assert "bpslaunch: worker 1 (local rank 1) exited with code 1; terminating 2 other process(es)" in err
    assert elapsed < 5, f"took {elapsed:.1f} s"
    pids = job.pids()
    assert len(pids) == 6  # three workers, three background grandchildren
    assert wait_until_dead(pids, timeout=1) == []


def test_death_by_signal_is_reported_as_128_plus_n(job):
    script = RECORD_PIDS + 'if [ "$BYTEPS_LOCAL_RANK" = 0 ]; then sleep 0.3; kill -SEGV $$; fi; exec sleep 60'
    rc, _, err = job.run(sh(script), env=workers_env(job, 2))
    assert rc == 128 + signal.SIGSEGV
    assert "worker 0 (local rank 0) was killed by SIGSEGV (signal 11)" in err
    assert wait_until_dead(job.pids(), timeout=1) == []


def test_exit_code_of_a_single_worker_passes_through(job):
    rc, _, err = job.run(sh("exit 7"))
    assert rc == 7
    assert "worker 0 (local rank 0) exited with code 7" in err


def test_success_cleans_up_what_workers_left_behind(job):
    rc, _, err = job.run(sh(RECORD_PIDS + "exit 0"), env=workers_env(job, 2))
    assert rc == 0
    assert "exited but left processes running; terminating them" in err
    assert wait_until_dead(job.pids(), timeout=1) == []


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_signal_to_bpslaunch_tears_down_everything(job, sig, code):
    # Besides the background grandchild, each worker starts a daemon in its own
    # session: out of reach of the process-group kill, caught as an adopted orphan.
    script = RECORD_PIDS + 'setsid sleep 301 & echo $! >> "$BPSTEST_PIDDIR/pids"; exec sleep 60'
    proc = job.start(sh(script), env=workers_env(job, 2))
    pids = job.wait_for_pids(6)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == code
    assert f"received {signal.Signals(sig).name}; terminating the job" in err.decode()
    assert wait_until_dead(pids, timeout=1) == []


_IGNORES_SIGTERM = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready')\n"
    "time.sleep(60)\n"
)


def test_grace_period_then_sigkill(job):
    proc = job.start(["--grace-period", "0.5", PY, "-c", _IGNORES_SIGTERM])
    assert proc.stdout.readline() == b"[worker 0] ready\n"
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=10)
    elapsed = time.monotonic() - sent
    assert proc.returncode == 143
    assert "worker 0 (local rank 0) still running 0.5 s after SIGTERM; sending SIGKILL" in err.decode()
    assert 0.4 < elapsed < 4


def test_second_signal_skips_the_grace_period(job):
    proc = job.start(["--grace-period", "60", PY, "-c", _IGNORES_SIGTERM])
    assert proc.stdout.readline() == b"[worker 0] ready\n"
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 130
    assert "received SIGINT while terminating; killing the job now" in err.decode()
    assert time.monotonic() - sent < 4


def test_sigkill_of_bpslaunch_kills_children_and_grandchildren(job):
    proc = job.start(sh(RECORD_PIDS + "exec sleep 60"), env=workers_env(job, 2))
    pids = job.wait_for_pids(4)
    assert all(is_alive(pid) for pid in pids)
    proc.kill()  # no handler runs: only the kernel (death signal) and the group reaper act
    proc.wait()
    assert wait_until_dead(pids, timeout=5) == []
