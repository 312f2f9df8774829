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


FIRST_ROUND_FAILS_THEN_AGREES = r"""
import time
import numpy as np
import byteps.common as bps
bps.init()
rank = bps.rank()
time.sleep(0.6 * rank)   # worker 0 declares first, worker 2 (as worker 0 does) after the round failed
x = np.ones((2, 2) if rank == 1 else (4,), dtype=np.float32)
try:
    bps.push_pull(x, name="w")
    print("no error: silently wrong", flush=True)
except bps.PushPullError as exc:
    print("FAILED:", exc, flush=True)
y = bps.push_pull(np.full(5, rank + 1.0, dtype=np.float32), name="w", average=False)
assert np.array_equal(y, np.full(5, 6.0, dtype=np.float32)), y
print("AGREED", flush=True)
"""


def test_a_name_whose_first_round_failed_everywhere_is_declared_afresh_by_its_next_use():
    # Three workers: worker 1's declaration of "w" is refused; worker 2's, which matches worker 0's, comes later
    # and is for the failed round: it fails too instead of waiting for a round that cannot close. Then every
    # worker uses "w" with one shape: a new tensor, none of the failed declaration left on worker or server.
    result = run_job([sys.executable, "-c", FIRST_ROUND_FAILS_THEN_AGREES], 3, 1, timeout=60)
    assert not result.timed_out, result.failures()
    for rank in range(3):
        out = result.outputs[f"worker{rank}"]
        assert result.codes[f"worker{rank}"] == 0, out
        assert "FAILED: push_pull of 'w' failed" in out and "shape 2x2" in out, out
        assert "AGREED" in out, out


PUSH_CARRIES_PULL = r"""
import json
import numpy as np
import byteps.common as bps
from byteps.common.api import worker
bps.init()
rank, size = bps.rank(), bps.size()
for round_ in range(3):
    for name, count in (("a", 2500), ("b", 7)):        # 2500 float32 in 4000-byte partitions: 3 keys, "b": 1
        x = np.arange(count, dtype=np.float32) * (rank + 1) + round_
        bps.push_pull(x, name=name, average=False)
        expected = np.arange(count, dtype=np.float32) * sum(r + 1 for r in range(size)) + size * round_
        assert np.array_equal(x, expected), (name, round_, x[:4], expected[:4])
counters = [c.counters for c in worker()._comm.connections]
print("COUNTS", json.dumps({"sent": sum(c.messages_sent for c in counters),
                            "received": sum(c.messages_received for c in counters)}), flush=True)
bps.shutdown()
"""


@pytest.mark.parametrize("workers", [1, 2])
def test_a_push_carries_its_pull_and_the_push_answered_at_once_is_not_acknowledged(workers):
    # 4 keys x 3 rounds per worker. Sent: one INIT_KEY per key, then one PUSH per key and round, no PULL
    # (the push carries it, FLAG_PULL). Received: one answer per push, and a PUSH_ACK for every push but
    # the one that completes its round (answered at once): 12 rounds of 4 keys across the workers.
    result = run_job([sys.executable, "-c", PUSH_CARRIES_PULL], workers, 1, timeout=60,
                     env={"BYTEPS_PARTITION_BYTES": str(PARTITION_BYTES), "BYTEPS_FORCE_DISTRIBUTED": "1"})
    assert_ok(result)
    counts = [json.loads(re.search(r"COUNTS (.*)", result.outputs[f"worker{rank}"]).group(1))
              for rank in range(workers)]
    keys, rounds = 4, 3
    assert all(c["sent"] == keys + keys * rounds for c in counts), counts
    acks = sum(c["received"] for c in counts) - workers * keys * rounds
    assert acks == (workers - 1) * keys * rounds, counts
