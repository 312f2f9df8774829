"""Soak: 2,000 rounds of a 200-tensor model, 2 workers, 2 servers: no memory growth, no leaked fds."""

import os
import re
import sys
import time

import pytest

from byteps.testkit import start_job

WORKER = [sys.executable, os.path.join(os.path.dirname(__file__), "soak_worker.py")]
ROUNDS, TENSORS, WARMUP = 2000, 200, 200
MAX_GROWTH = 0.05


def sample(pid):
    with open(f"/proc/{pid}/status") as status:
        rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.skipif(os.environ.get("BYTEPS_SOAK") != "1",
                    reason="a soak takes minutes: `nox -s soak` runs it (BYTEPS_SOAK=1)")
def test_soak_memory_and_descriptors_stay_flat():
    job = start_job(WORKER + [str(ROUNDS), str(TENSORS), str(WARMUP)], 2, 2, timeout=1500)
    samples = {}
    try:
        for checkpoint in (WARMUP, ROUNDS):
            deadline = time.monotonic() + 1200
            while not all(f"CHECKPOINT {checkpoint} " in job.output(f"worker{r}") for r in (0, 1)):
                assert time.monotonic() < deadline, f"the soak did not reach round {checkpoint}"
                assert all(p.poll() in (None, 0) for p in job.procs.values()), "a process died"
                time.sleep(0.2)
            for name in ("scheduler", "server0", "server1"):
                samples[(name, checkpoint)] = sample(job.procs[name].pid)
        assert job.wait(120)
    finally:
        result = job.finish()
    assert all(code == 0 for code in result.codes.values()), result.failures()
    for rank in (0, 1):
        found = dict(re.findall(r"CHECKPOINT (\d+) rss_kib=(\d+ fds=\d+)", result.outputs[f"worker{rank}"]))
        for checkpoint in (WARMUP, ROUNDS):
            rss, fds = found[str(checkpoint)].split(" fds=")
            samples[(f"worker{rank}", checkpoint)] = (int(rss), int(fds))
    report = []
    for name in ("scheduler", "server0", "server1", "worker0", "worker1"):
        (rss0, fds0), (rss1, fds1) = samples[(name, WARMUP)], samples[(name, ROUNDS)]
        growth = (rss1 - rss0) / rss0
        report.append(f"{name}: RSS {rss0} -> {rss1} KiB ({growth:+.1%}), fds {fds0} -> {fds1}")
        assert growth <= MAX_GROWTH, "\n".join(report)
        assert fds1 <= fds0, "\n".join(report)
    print("\n".join(report))
