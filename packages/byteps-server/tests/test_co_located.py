"""Servers on the workers' host: payloads go through shared memory, and the sums are those of the TCP path.

Real jobs on 127.0.0.1 (every server is on the workers' host); each worker
checks every result against numpy, and the job reports say which path the
payloads took.
"""

import json
import sys

import pytest

from byteps.testkit import run_job

WORKER = [sys.executable, "-m", "byteps.testkit.push_pull_worker"]
TENSORS = [
    # several 512000-byte partitions each (shared memory), and small ones (inline)
    {"name": "big.f32", "dtype": "float32", "count": 1_300_001, "average": True},
    {"name": "big.i64", "dtype": "int64", "count": 300_000, "average": False},
    {"name": "small.f32", "dtype": "float32", "count": 1000, "average": True},
]


def run(tmp_path, enable_ipc, handles=False):
    reports = tmp_path / f"reports-{enable_ipc}-{handles}"
    reports.mkdir()
    spec = {"rounds": 4, "tensors": TENSORS, "async": handles}  # async: every push_pull in flight at once
    result = run_job(WORKER + [json.dumps(spec)], 2, 2, timeout=120,
                     env={"BYTEPS_ENABLE_IPC": enable_ipc, "BYTEPS_REPORT_DIR": str(reports)})
    assert not result.timed_out, "job timed out:\n" + result.failures()
    assert all(code == 0 for code in result.codes.values()), result.failures()
    for rank in range(2):
        assert f"rank {rank} of 2: 4 rounds of {len(TENSORS)} tensors OK" in result.outputs[f"worker{rank}"]
    return {path.stem: json.loads(path.read_text()) for path in reports.glob("*.json")}


@pytest.mark.parametrize("handles", [False, True])
def test_payloads_go_through_shared_memory_and_match_numpy(tmp_path, handles):
    reports = run(tmp_path, "1", handles)
    assert set(reports) == {"worker-0", "worker-1", "server-0", "server-1"}
    # Every partition of the big tensors (12 + 6 of 512000 bytes or less: cut into a multiple of the 2 servers,
    # each above the 64 KiB threshold), pushed and pulled in each of the 4 rounds; the small tensor inline.
    assert reports["worker-0"]["shared_payloads"] == reports["worker-1"]["shared_payloads"] == 4 * 18 * 2
    assert reports["server-0"]["shared_payloads"] + reports["server-1"]["shared_payloads"] == 2 * 4 * 18 * 2

def test_without_ipc_every_payload_goes_over_tcp_with_the_same_results(tmp_path):
    reports = run(tmp_path, "0")
    assert all(report["shared_payloads"] == 0 for report in reports.values()), reports
