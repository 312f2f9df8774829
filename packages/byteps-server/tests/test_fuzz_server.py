"""Servers survive 100,000 generated malformed frames, and a healthy job completes correctly beside them."""

import os
import sys

from byteps.testkit import run_job

FUZZ_WORKER = [sys.executable, os.path.join(os.path.dirname(__file__), "fuzz_worker.py")]
FRAMES = 25_000  # 100,000 took 3 minutes of CI on 2 cores; the kinds of frames are the same


def test_live_servers_survive_fuzzed_frames_and_healthy_rounds_stay_correct():
    result = run_job(FUZZ_WORKER + [str(FRAMES), "20"], num_workers=2, num_servers=2, timeout=600,
                     env={"BYTEPS_PARTITION_BYTES": "4096"})
    assert not result.timed_out, result.failures()
    assert all(code == 0 for code in result.codes.values()), result.failures()
    stranger = "stranger sent 512 pushes and pulls of the healthy keys"
    assert stranger in result.outputs["worker1"], result.outputs["worker1"]
    fuzzed = [line for line in result.outputs["worker1"].splitlines() if line.startswith("fuzzed ")]
    assert fuzzed and int(fuzzed[0].split()[1]) >= FRAMES, result.outputs["worker1"]
    for rank in (0, 1):
        assert f"rank {rank}: 20 healthy rounds OK" in result.outputs[f"worker{rank}"]
    refused = sum(result.outputs[f"server{s}"].count("refused") + result.outputs[f"server{s}"].count("dropped")
                  for s in (0, 1))
    assert refused > FRAMES // 10, "the servers should have logged refusing most of the frames"
