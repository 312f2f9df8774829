"""Real jobs: a scheduler, servers and workers as processes on 127.0.0.1.

Each worker push_pulls generated tensors and checks every result against a
numpy reference it computes itself (exact for integers).
"""

import json
import re
import sys

import pytest

from byteps.testkit import run_job

WORKER = [sys.executable, "-m", "byteps.testkit.push_pull_worker"]
DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64"]
PARTITION_BYTES = 4000  # small, so that modest tensors span several partitions


def tensors(counts, dtypes=DTYPES):
    out = []
    for dtype in dtypes:
        for count in counts:
            for average in (True, False):
                out.append({"name": f"{dtype}.{count}.{'avg' if average else 'sum'}",
                            "dtype": dtype, "count": count, "average": average})
    return out


def assert_ok(result):
    assert not result.timed_out, "job timed out:\n" + result.failures()
    assert all(code == 0 for code in result.codes.values()), result.failures()


# sizes: one element, below / exactly / just above one partition, several partitions with a tail
COUNTS = [1, 7, 500, 1000, 1001, 2500, 4099]


@pytest.mark.parametrize("workers,servers", [(1, 1), (2, 1), (2, 2), (4, 2)])
def test_every_dtype_and_size_matches_numpy(workers, servers):
    spec = {"rounds": 3, "tensors": tensors(COUNTS)}
    result = run_job(WORKER + [json.dumps(spec)], workers, servers,
                     env={"BYTEPS_FORCE_DISTRIBUTED": "1", "BYTEPS_PARTITION_BYTES": str(PARTITION_BYTES)})
    assert_ok(result)
    for rank in range(workers):
        assert f"rank {rank} of {workers}: 3 rounds of {len(spec['tensors'])} tensors OK" in \
            result.outputs[f"worker{rank}"]


def test_many_tensors_many_rounds_async():
    spec = {"rounds": 20, "async": True,
            "tensors": [{"name": f"layer{i}", "dtype": "float32", "count": 10 + 37 * i, "average": True}
                        for i in range(60)]}
    result = run_job(WORKER + [json.dumps(spec)], 2, 2, env={"BYTEPS_PARTITION_BYTES": "2048"})
    assert_ok(result)


def test_local_processes_on_two_machines():
    spec = {"rounds": 2, "tensors": tensors([3, 3000], ["float32", "int64"])}
    result = run_job(WORKER + [json.dumps(spec)], 2, 1, local_size=2,
                     env={"BYTEPS_PARTITION_BYTES": str(PARTITION_BYTES)})
    assert_ok(result)
    assert "rank 3 of 4" in result.outputs["worker3"]


def test_default_partition_size_with_a_large_tensor():
    # 10.4 MB: cut at the default partition size into a multiple of the 2 servers, the last one short
    spec = {"rounds": 2, "tensors": [{"name": "big", "dtype": "float32", "count": 2_600_001, "average": True}]}
    result = run_job(WORKER + [json.dumps(spec)], 2, 2)
    assert_ok(result)


HELD = re.compile(r"sums were held in ([0-9.]+) MiB of buffers for (\d+) keys of ([0-9.]+) MiB")


@pytest.mark.parametrize("ipc", ["1", "0"], ids=["shared-memory", "tcp"])
def test_a_server_holds_sums_for_the_rounds_in_flight_not_two_per_key(ipc):
    # 16 tensors of 256 KiB, 4 rounds: each round's sum is released once both workers have their answer, so
    # the server's sum buffers stay within the 4 MiB it owns (two results per key would be 8 MiB).
    spec = {"rounds": 4, "tensors": [{"name": f"w{i}", "dtype": "float32", "count": 65536, "average": True}
                                     for i in range(16)]}
    result = run_job(WORKER + [json.dumps(spec)], 2, 1, env={"BYTEPS_LOG_LEVEL": "INFO", "BYTEPS_ENABLE_IPC": ipc})
    assert_ok(result)
    held = HELD.search(result.outputs["server0"])
    assert held, result.outputs["server0"][-2000:]
    held_mib, keys, owned_mib = float(held.group(1)), int(held.group(2)), float(held.group(3))
    assert (keys, owned_mib) == (16, 4.0)
    assert 0 < held_mib <= owned_mib, held.group(0)


MISMATCH = r"""
import numpy as np
import byteps.common as bps
bps.init()
x = np.ones(100 * (bps.rank() + 1), dtype=np.float32)   # rank 1 pushes twice as many elements
try:
    bps.push_pull(x, name="grad")
except bps.PushPullError as exc:
    print("FAILED:", exc, flush=True)
    raise SystemExit(1)
print("no error: silently wrong", flush=True)
"""


def test_tensors_that_differ_across_workers_fail_on_every_rank_naming_both():
    result = run_job([sys.executable, "-c", MISMATCH], 2, 1, timeout=60)
    assert not result.timed_out, result.failures()
    for rank in (0, 1):
        out = result.outputs[f"worker{rank}"]
        assert result.codes[f"worker{rank}"] == 1, out
        assert "FAILED: push_pull of 'grad' failed" in out and "mismatch for key 0" in out, out
        assert "400 bytes of float32" in out and "800 bytes of float32" in out, out


SHAPE_MISMATCH = r"""
import numpy as np
import byteps.common as bps
bps.init()
x = np.ones((2, 3) if bps.rank() == 0 else (3, 2), dtype=np.float32)   # same bytes, other shape
try:
    bps.push_pull(x, name="w")
except bps.PushPullError as exc:
    print("FAILED:", exc, flush=True)
    raise SystemExit(1)
"""


def test_same_bytes_in_another_shape_fail_on_every_rank():
    result = run_job([sys.executable, "-c", SHAPE_MISMATCH], 2, 1, timeout=60)
    assert not result.timed_out, result.failures()
    for rank in (0, 1):
        out = result.outputs[f"worker{rank}"]
        assert result.codes[f"worker{rank}"] == 1, out
        assert "shape 2x3" in out and "shape 3x2" in out, out
