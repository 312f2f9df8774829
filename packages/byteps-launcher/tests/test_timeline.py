"""The timeline of a real job: every worker and server writes its trace, and the merge joins them."""

from __future__ import annotations

import json
import os
import subprocess
from collections import defaultdict

from launcher_harness import PY

from byteps.testkit import launch_job, report

WORKER = """
import numpy as np
import byteps.common as bps
bps.init()
dense = np.ones(3000, np.float32)        # 3 partitions of at most 4096 bytes
packed = np.ones(2000, np.float32)       # 2 partitions, compressed
for _ in range(6):
    bps.push_pull(dense, name="dense")
    bps.push_pull(packed, name="packed", compression_params={"compressor": "onebit", "scaling": True})
print("rank", bps.rank(), "done")
"""
STEPS = (1, 2, 3, 4)
ROUTE = ("compress", "push", "pull", "decompress", "copy_out")  # in this order, for each partition


def _run(tmp_path, **env):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    settings = {"BYTEPS_TRACE_ON": "1", "BYTEPS_TRACE_START_STEP": "1", "BYTEPS_TRACE_END_STEP": "4",
                "BYTEPS_TRACE_DIR": str(tmp_path / "trace"), "BYTEPS_PARTITION_BYTES": "4096",
                "BYTEPS_MIN_COMPRESS_BYTES": "4096", **env}
    return launch_job(["--workers", "2", "--servers", "1"], str(script), env=settings, timeout=60)


def _events(path):
    with open(path) as handle:
        document = json.load(handle)
    events = document["traceEvents"]
    for event in events:  # the parts of Chrome's trace event format a viewer needs
        assert {"name", "ph", "pid", "tid"} <= set(event), event
        if event["ph"] == "X":
            assert event["dur"] >= 0 and isinstance(event["ts"], (int, float)), event
    return [e for e in events if e["ph"] == "X"]


def test_workers_and_servers_trace_every_stage_of_the_traced_steps(tmp_path):
    result = _run(tmp_path)
    assert result.returncode == 0, report(result)
    trace = tmp_path / "trace"
    workers = [trace / f"machine{m}" / "0" / "comm.json" for m in (0, 1)]
    server = trace / "server0" / "comm.json"
    for path in [*workers, server]:  # every process estimated its clock against the scheduler's
        metadata = json.load(open(path))["metadata"]
        assert abs(metadata["clock_offset_s"]) < 0.05 and 0 <= metadata["clock_error_s"] < 0.05, metadata
    for rank, path in enumerate(workers):
        spans = _events(path)
        assert {e["pid"] for e in spans} == {rank}
        tensors = sorted((e["name"], e["args"]["step"]) for e in spans if e["cat"] == "tensor")
        assert tensors == sorted((name, step) for name in ("dense", "packed") for step in STEPS)
        by_partition = defaultdict(list)
        for e in spans:
            if e["cat"] != "tensor":
                by_partition[(e["name"], e["args"]["partition"], e["args"]["step"])].append(e)
        assert sorted(by_partition) == sorted((name, p, s) for name, parts in (("dense", 3), ("packed", 2))
                                              for p in range(parts) for s in STEPS)
        for (name, _, _), stages in by_partition.items():
            stages.sort(key=lambda e: e["ts"])
            expected = ROUTE if name == "packed" else ("push", "pull", "copy_out")
            assert tuple(e["cat"] for e in stages) == expected, stages
            for before, after in zip(stages, stages[1:]):  # one stage ends where the next begins
                assert before["ts"] + before["dur"] <= after["ts"] + 1, (before, after)
    served = _events(server)
    receipts = sorted((e["name"], e["args"]["partition"], e["args"]["step"], e["args"]["worker"])
                      for e in served if e["cat"] == "receive")
    assert receipts == sorted((name, p, s, w) for name, parts in (("dense", 3), ("packed", 2))
                              for p in range(parts) for s in STEPS for w in (0, 1))
    assert sum(e["cat"] == "sum" for e in served) == 5 * len(STEPS)
    assert sum(e["cat"] == "answer" for e in served) == 2 * 5 * len(STEPS)

    picture = tmp_path / "timeline.png"
    merged = subprocess.run([PY, "-m", "byteps.launcher.trace", "merge", str(trace), "--png", str(picture)],
                            capture_output=True, text=True, timeout=120)
    assert merged.returncode == 0, merged.stderr
    assert merged.stdout.startswith("merged 3 processes, ") and "80 flows" in merged.stdout, merged.stdout
    document = json.load(open(trace / "merged.json"))
    assert document["metadata"]["clock_alignment"] == "offsets from heartbeat round trips"
    assert document["metadata"]["clock_error_bound_s"] < 0.05
    events = document["traceEvents"]
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts.keys() == ends.keys() and len(starts) == 80
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.stat().st_size > 10_000
    for flow_id, start in starts.items():  # one machine's clocks: every receipt after its push began
        assert ends[flow_id]["ts"] >= start["ts"], (start, ends[flow_id])
        assert (start["pid"] >= 1000) != (ends[flow_id]["pid"] >= 1000)  # worker <-> server


def test_bad_trace_settings_fail_before_anything_runs(tmp_path):
    result = _run(tmp_path, BYTEPS_TRACE_START_STEP="5", BYTEPS_TRACE_END_STEP="5")
    assert result.returncode == 2
    assert "configuration error: BYTEPS_TRACE_END_STEP: must be > BYTEPS_TRACE_START_STEP=5, got 5" in result.stderr
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    result = _run(tmp_path, BYTEPS_TRACE_DIR=str(blocked / "trace"))
    assert result.returncode != 0
    assert "BYTEPS_TRACE_DIR: cannot write the trace" in result.stderr, report(result)


def test_merge_says_what_is_missing(tmp_path):
    result = subprocess.run([PY, "-m", "byteps.launcher.trace", "merge", str(tmp_path)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and "no comm.json under" in result.stderr and "BYTEPS_TRACE_ON=1" in result.stderr
    assert os.listdir(tmp_path) == []  # and it wrote nothing
