"""Jobs with DMLC_ENABLE_RDMA=1: the servers' and workers' payloads by RDMA WRITE, sums checked against numpy.

No RDMA device is here, so every process starts through the verbs stand-in
(``python -m byteps.testkit.verbs_stand_in``): memfds and copies between
processes in place of a NIC (docs/rdma.md). The scheduler, server and
worker processes, their handshakes, rings and page tables are real.
"""

import json
import sys

from byteps.testkit import run_job

STAND_IN = [sys.executable, "-m", "byteps.testkit.verbs_stand_in"]
WORKER = STAND_IN + ["-m", "byteps.testkit.push_pull_worker"]
SERVER = STAND_IN + ["-m", "byteps.server"]
TENSORS = [
    {"name": "big.f32", "dtype": "float32", "count": 1_300_001, "average": True},
    {"name": "big.i64", "dtype": "int64", "count": 300_000, "average": False},
    {"name": "small.f32", "dtype": "float32", "count": 1000, "average": True},
]


def test_a_job_moves_its_payloads_by_rdma_and_matches_numpy(tmp_path):
    spec = {"rounds": 4, "tensors": TENSORS}
    result = run_job(WORKER + [json.dumps(spec)], 2, 2, timeout=120, server_argv=SERVER,
                     env={"DMLC_ENABLE_RDMA": "1", "BYTEPS_REPORT_DIR": str(tmp_path)})
    assert not result.timed_out, "job timed out:\n" + result.failures()
    assert all(code == 0 for code in result.codes.values()), result.failures()
    for rank in range(2):
        assert f"rank {rank} of 2: 4 rounds of {len(TENSORS)} tensors OK" in result.outputs[f"worker{rank}"]
    reports = {path.stem: json.loads(path.read_text()) for path in tmp_path.glob("*.json")}
    # 18 large partitions per round (12 + 6, cut for the 2 servers), each pushed and pulled. Each connection's
    # first push goes inline with its HELLO, and the pushes and answers of round 0 go inline until the WELCOME
    # and the worker's first write arrive (how many depends on timing); from round 1 on, every one is written.
    # Nothing goes through the co-located shared-memory path: RDMA replaces it.
    for rank in range(2):
        report = reports[f"worker-{rank}"]
        assert 3 * 18 * 2 <= report["rdma_payloads"] < 4 * 18 * 2, report
        assert report["shared_payloads"] == 0
    assert reports["server-0"]["rdma_payloads"] + reports["server-1"]["rdma_payloads"] == \
        reports["worker-0"]["rdma_payloads"] + reports["worker-1"]["rdma_payloads"]


def test_a_node_without_rdma_is_refused_naming_the_variable():
    """Every role must agree on DMLC_ENABLE_RDMA: the scheduler refuses the node that differs."""
    spec = {"rounds": 1, "tensors": TENSORS[2:]}
    result = run_job(WORKER + [json.dumps(spec)], 2, 1, timeout=60, server_argv=SERVER,
                     env={"DMLC_ENABLE_RDMA": "1"}, overrides={"worker1": {"DMLC_ENABLE_RDMA": "0"}})
    assert not result.timed_out, result.failures()
    assert result.codes["worker1"] != 0
    assert "DMLC_ENABLE_RDMA" in result.outputs["worker1"], result.outputs["worker1"]


def test_without_an_rdma_device_every_role_fails_at_once_saying_why():
    """No stand-in and no pyverbs here: DMLC_ENABLE_RDMA=1 ends the job, each process naming what is missing."""
    spec = {"rounds": 1, "tensors": TENSORS[2:]}
    result = run_job([sys.executable, "-m", "byteps.testkit.push_pull_worker", json.dumps(spec)], 1, 1,
                     timeout=60, env={"DMLC_ENABLE_RDMA": "1"})
    assert not result.timed_out, result.failures()
    assert result.codes["worker0"] != 0 or result.codes["server0"] != 0
    failed = [name for name in ("worker0", "server0") if result.codes[name] != 0]
    for name in failed:
        assert "DMLC_ENABLE_RDMA=1" in result.outputs[name] and "pyverbs" in result.outputs[name], \
            result.outputs[name]
