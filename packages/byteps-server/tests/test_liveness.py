"""Heartbeats: when a worker, a server or the scheduler dies, every survivor says which, within seconds.

The processes are started one by one with role environments, as on real
machines (no bpslaunch to notice the death): only heartbeats can tell.
"""

import os
import sys
import time

import pytest

from byteps.testkit import start_job

WORKER = [sys.executable, os.path.join(os.path.dirname(__file__), "liveness_worker.py")]
FAST_HEARTBEAT = {"PS_HEARTBEAT_INTERVAL": "0.5", "PS_HEARTBEAT_TIMEOUT": "3"}
DETECTION_LIMIT_S = 15


def run_and_kill(victim):
    job = start_job(WORKER, num_workers=2, num_servers=1, env=FAST_HEARTBEAT)
    try:
        deadline = time.monotonic() + 60
        while not all("training" in job.output(f"worker{r}") for r in (0, 1)):
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.1)
        time.sleep(0.5)
        job.kill(victim)
        killed = time.monotonic()
        finished = job.wait(DETECTION_LIMIT_S + 5, stop_on_failure=False)
        elapsed = time.monotonic() - killed
    finally:
        result = job.finish()
    assert finished, f"survivors still running {DETECTION_LIMIT_S + 5} s after the kill:\n{result.failures()}"
    assert elapsed < DETECTION_LIMIT_S, f"took {elapsed:.1f} s"
    return result


@pytest.mark.parametrize("victim,named", [
    ("worker1", "worker 1 local rank 0"),
    ("server0", "server at 127.0.0.1:"),
])
def test_every_survivor_names_the_dead_node(victim, named):
    result = run_and_kill(victim)
    survivors = [name for name in result.codes if name != victim]
    for name in survivors:
        assert result.codes[name] != 0, f"{name} exited 0 after {victim} died:\n{result.outputs[name]}"
        text = result.outputs[name]
        assert named in text and "presumed dead" in text, f"{name} did not name the dead node:\n{text[-2000:]}"


def test_survivors_notice_a_dead_scheduler():
    result = run_and_kill("scheduler")
    for name in ("server0", "worker0", "worker1"):
        assert result.codes[name] != 0, result.outputs[name]
        assert "the scheduler at tcp://127.0.0.1:" in result.outputs[name], result.outputs[name][-2000:]
        assert "presumed dead" in result.outputs[name]
