"""A real job tells what it is doing: its plan, the rendezvous, who waits for what, and a summary at the end."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest
from launcher_harness import PY

from byteps.testkit import free_port

ROUNDS = 5
WORKER = f"""
import numpy as np
import byteps.common as bps
bps.init()
x = np.ones(300_000, dtype=np.float32)
for _ in range({ROUNDS}):
    bps.push_pull(x, name="x", average=False)
print("rank", bps.rank(), "done", x[0])
"""
# One round moves each partition once each way: 1.2 MB here (3 partitions), plus headers.
PAYLOAD_MB = ROUNDS * 1_200_000 / 1e6


def _summary(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("bpslaunch: job done in ")]
    assert len(lines) == 1, err
    return lines[0]


def test_a_healthy_job_prints_its_plan_the_rendezvous_and_a_summary(job):
    rc, out, err = job.run(["--workers", "2", "--servers", "2", "--", PY, "-c", WORKER], timeout=60)
    assert rc == 0, err
    assert "[worker 0] rank 0 done 32.0" in out and "[worker 1] rank 1 done 32.0" in out
    assert re.search(r"^bpslaunch: embedded job: scheduler on 127\.0\.0\.1:\d+, 2 servers, "
                     r"2 worker processes \(2 machines x 1\)", err, re.M), err
    assert re.search(r"^\[scheduler\] byteps: scheduler up on tcp://127\.0\.0\.1:\d+; "
                     r"waiting for 2 servers and 2 worker machines$", err, re.M), err
    assert re.search(r"^\[scheduler\] byteps: all nodes registered in [\d.]+ s: 2 servers, "
                     r"2 worker processes on 2 machines$", err, re.M), err
    summary = _summary(err)
    found = re.fullmatch(r"bpslaunch: job done in [\d.]+ s, 2 workers, 5 rounds \(mean [\d.]+ ms\), "
                         r"each pushed ([\d.]+) MB and pulled ([\d.]+) MB, "
                         # every partition both ways, 2 workers x 5 rounds x 4 (a multiple of the 2 servers): the
                         # servers are on this host
                         r"80 payloads through shared memory \(co-located servers\), "
                         r"servers' share of the bytes (\d+)% / (\d+)%", summary)
    assert found, summary
    pushed, pulled, first, second = map(float, found.groups())
    assert PAYLOAD_MB <= pushed < 1.1 * PAYLOAD_MB and PAYLOAD_MB <= pulled < 1.1 * PAYLOAD_MB
    assert 98 <= first + second <= 102 and min(first, second) >= 25  # 3 partitions: on both servers


def test_quiet_keeps_only_what_the_workers_print(job):
    rc, out, err = job.run(["-q", "--workers", "2", "--servers", "1", "--", PY, "-c", WORKER], timeout=60)
    assert rc == 0, err
    assert "rank 1 done 32.0" in out and err == ""


def test_a_failed_job_says_so_at_the_end(job):
    rc, _, err = job.run(["-np", "2", "--", PY, "-c", "import sys; sys.exit(5)"], timeout=60)
    assert rc == 5
    assert re.search(r"^bpslaunch: job failed after [\d.]+ s with exit status 5$", err, re.M), err


def test_a_worker_without_its_scheduler_says_what_it_waits_for_then_fails_naming_the_address(job):
    port = free_port()
    env = job.env(DMLC_ROLE="worker", DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(port),
                  DMLC_NUM_SERVER="1", BYTEPS_FORCE_DISTRIBUTED="1", BYTEPS_RENDEZVOUS_TIMEOUT="8")
    proc = job.start([PY, "-c", "import byteps.common as bps; bps.init()"], env=env)
    lines = [raw.decode() for raw in proc.stderr]
    proc.wait(timeout=30)
    err = "".join(lines)
    assert proc.returncode == 1, err
    # The waiting line (after 5 s without an answer, it says) comes before the give-up at 8 s: the order, not a
    # wall-clock bound, which a loaded machine's interpreter start would blur.
    waiting = next((i for i, line in enumerate(lines) if "waits for the scheduler" in line), None)
    giving_up = next((i for i, line in enumerate(lines) if "RendezvousTimeout" in line), None)
    assert waiting is not None and giving_up is not None and waiting < giving_up, err
    assert (f"[worker 0] byteps: worker 0 waits for the scheduler at tcp://127.0.0.1:{port}: no answer for 5 s "
            "(is it running? DMLC_PS_ROOT_URI/DMLC_PS_ROOT_PORT); giving up after 8 s") in err
    assert (f"no answer from the scheduler at tcp://127.0.0.1:{port} within 8 s (BYTEPS_RENDEZVOUS_TIMEOUT): "
            "is it running? check DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT") in err


# A server and scheduler started long before their workers wait for them (the soak run waits 5 minutes).
LATE_S = 300.0 if os.environ.get("BYTEPS_SOAK") else 12.0


@pytest.mark.parametrize("delay_s", [LATE_S])
def test_role_mode_servers_wait_for_late_workers(job, delay_s):
    port = str(free_port())
    common = dict(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=port, DMLC_NUM_WORKER="2", DMLC_NUM_SERVER="1",
                  DMLC_NODE_HOST="127.0.0.1", BYTEPS_JOB_SECRET="s3cret")
    scheduler = job.start([], env=job.env(DMLC_ROLE="scheduler", **common))
    server = job.start([], env=job.env(DMLC_ROLE="server", **common))
    time.sleep(delay_s)
    assert scheduler.poll() is None and server.poll() is None, "a server or the scheduler gave up waiting"
    workers = [job.start([PY, "-c", WORKER], env=job.env(DMLC_ROLE="worker", DMLC_WORKER_ID=str(w), **common))
               for w in range(2)]
    outputs = [w.communicate(timeout=60) for w in workers]
    for w, (out, err) in enumerate(outputs):
        assert workers[w].returncode == 0, err.decode()
        assert f"rank {w} done 32.0" in out.decode()
    server_err = server.communicate(timeout=30)[1].decode()
    scheduler_err = scheduler.communicate(timeout=30)[1].decode()
    assert server.returncode == 0 and scheduler.returncode == 0, server_err + scheduler_err
    assert "byteps: server registered; the scheduler still waits for the 2 worker machines" in server_err
    assert "waiting as long as it takes" in server_err
    assert "byteps: scheduler still waits for the 2 worker machines" in scheduler_err
    assert re.search(r"^bpslaunch: job done in [\d.]+ s$", server_err, re.M), server_err


def test_the_relay_writes_a_redrawn_progress_bar_into_a_pipe_as_its_last_state(job):
    bar = ("import sys, time\n"
           "for i in range(3):\n    sys.stdout.write(f'\\r{i}/3'); sys.stdout.flush(); time.sleep(0.2)\n"
           "print()")
    proc = job.start(["-q", PY, "-c", bar])
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert out.decode() == "[worker 0] 2/3\n"  # a terminal: test_output.py


def test_server_command_rejects_arguments_in_one_line():
    result = subprocess.run([PY, "-m", "byteps.server", "--port", "9000"], capture_output=True, text=True,
                            env={**os.environ, "DMLC_ROLE": "server"}, timeout=30)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == ("byteps-server: unexpected argument '--port': the server is configured by "
                             "DMLC_*/BYTEPS_* variables only (see byteps-server --help)\n")
