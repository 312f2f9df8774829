"""Tensor fusion in real jobs: grouped push_pulls through scheduler, servers and workers.

Each worker submits ~300 tensors of mixed sizes and dtypes per round as
grouped calls (small ones fused into buckets, large ones alone) and checks
every result against a numpy reference it computes itself.
"""

import json
import os
import re
import sys
import time

import pytest

from byteps.testkit import run_job

WORKER = [sys.executable, os.path.join(os.path.dirname(__file__), "fusion_worker.py")]
DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64"]


def mixed_tensors(count=300):
    """Mostly small tensors (fused), every 25th one large (alone), dtypes and ops interleaved."""
    out = []
    for i in range(count):
        elements = 20_000 if i % 25 == 7 else 1 + (i * 37) % 700
        out.append({"name": f"layer{i}.{'w' if i % 25 == 7 else 'b'}", "dtype": DTYPES[i % len(DTYPES)],
                    "count": elements, "average": (i // len(DTYPES)) % 2 == 0})
    return out


def assert_ok(result):
    assert not result.timed_out, "job timed out:\n" + result.failures()
    assert all(code == 0 for code in result.codes.values()), result.failures()


def buckets_of(output):
    return int(re.search(r": (\d+) buckets", output).group(1))


@pytest.mark.parametrize("workers,servers", [(2, 1), (2, 2)])
@pytest.mark.parametrize("threshold", ["16384", "4096000"])
def test_fused_push_pull_matches_numpy(workers, servers, threshold):
    spec = {"rounds": 4, "tensors": mixed_tensors()}
    # small partitions, so that buckets span several partitions (and both servers)
    env = {"BYTEPS_FUSION_THRESHOLD": threshold, "BYTEPS_PARTITION_BYTES": "8192"}
    result = run_job(WORKER + [json.dumps(spec)], workers, servers, env=env)
    assert_ok(result)
    for rank in range(workers):
        out = result.outputs[f"worker{rank}"]
        assert f"rank {rank} of {workers}: 4 rounds of 300 fused tensors OK" in out, out
        # one bucket per dtype and op with the default threshold, more with 16 KB buckets
        assert buckets_of(out) == 12 if threshold == "4096000" else buckets_of(out) > 12, out


@pytest.mark.parametrize("machines,servers", [(1, 0), (2, 1)])
def test_fused_push_pull_with_local_aggregation(machines, servers):
    """Two processes per machine: buckets are summed in shared memory first, like any tensor."""
    spec = {"rounds": 3, "tensors": mixed_tensors(120)}
    env = {"BYTEPS_FUSION_THRESHOLD": "16384", "BYTEPS_PARTITION_BYTES": "8192"}
    result = run_job(WORKER + [json.dumps(spec)], machines, servers, local_size=2, env=env)
    assert_ok(result)
    size = 2 * machines
    for rank in range(size):
        assert f"rank {rank} of {size}: 3 rounds of 120 fused tensors OK" in result.outputs[f"worker{rank}"]


def test_resubmitting_a_group_in_flight_is_refused_without_corrupting_it():
    spec = {"rounds": 2, "busy_check": True, "tensors": mixed_tensors(30)}
    result = run_job(WORKER + [json.dumps(spec)], 2, 1, env={"BYTEPS_FUSION_THRESHOLD": "2048"})
    assert_ok(result)
    assert "BUSY: push_pull_group: bucket 'fused:layer0.b+" in result.outputs["worker0"], result.outputs["worker0"]


def test_fusion_disabled_still_correct():
    spec = {"rounds": 2, "tensors": mixed_tensors(60)}
    result = run_job(WORKER + [json.dumps(spec)], 2, 1, env={"BYTEPS_FUSION_THRESHOLD": "0"})
    assert_ok(result)
    assert buckets_of(result.outputs["worker0"]) == 0


def test_membership_mismatch_fails_on_every_rank_quickly():
    spec = {"rounds": 1, "mismatch": True, "tensors": mixed_tensors(40)}
    start = time.monotonic()
    result = run_job(WORKER + [json.dumps(spec)], 2, 1, timeout=60)
    assert not result.timed_out, result.failures()
    assert time.monotonic() - start < 30, "the mismatch took too long to surface"
    for rank in (0, 1):
        out = result.outputs[f"worker{rank}"]
        assert result.codes[f"worker{rank}"] == 1, out
        assert "FAILED: push_pull of 'layer0.b" in out and "mismatch for key" in out, out
        assert "'fused:layer0.b+" in out and "'fused:layer0.b.renamed+" in out, out
