"""The timeline of a real job: every worker and server writes its trace, and the merge joins them."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from collections import defaultdict

import pytest
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


#: Imported by every process of a job (a folder of the test's own first on PYTHONPATH); only the server's
#: wall clock (time.time, the clock of its spans and of its heartbeat clock estimate) is moved.
CLOCK_SHIFT = """
import os, time
if os.environ.get("DMLC_ROLE") == "server":
    _real, _offset = time.time, float(os.environ["TIMELINE_TEST_SERVER_CLOCK_S"])
    time.time = lambda: _real() + _offset
"""
SERVER_CLOCK_S = -3.0  # the server's clock runs 3 s behind everyone else's


def test_a_server_clock_3_s_behind_is_found_within_its_bound_and_the_merge_puts_receipts_after_pushes(tmp_path):
    shifted = tmp_path / "clock"
    shifted.mkdir()
    (shifted / "sitecustomize.py").write_text(CLOCK_SHIFT)
    result = _run(tmp_path, TIMELINE_TEST_SERVER_CLOCK_S=str(SERVER_CLOCK_S),
                  PYTHONPATH=os.pathsep.join(filter(None, [str(shifted), os.environ.get("PYTHONPATH")])))
    assert result.returncode == 0, report(result)
    trace = tmp_path / "trace"
    server = json.load(open(trace / "server0" / "comm.json"))["metadata"]
    # The estimate (scheduler minus server) holds the true offset within its stated bound.
    assert abs(server["clock_offset_s"] - -SERVER_CLOCK_S) <= server["clock_error_s"] < 0.05, server
    raw = {e["args"]["key"]: e for e in _events(trace / "server0" / "comm.json") if e["cat"] == "receive"}
    pushes = [e for m in (0, 1) for e in _events(trace / f"machine{m}" / "0" / "comm.json") if e["cat"] == "push"]
    # As recorded, every receipt seems to come about 3 s before the push it received: a merge that ignored
    # the offset would keep them so, and the checks below would fail.
    assert all(raw[push["args"]["key"]]["ts"] < push["ts"] - 2e6 for push in pushes if push["args"]["key"] in raw)

    merged = subprocess.run([PY, "-m", "byteps.launcher.trace", "merge", str(trace)], capture_output=True, text=True,
                            timeout=120)
    assert merged.returncode == 0, merged.stderr
    document = json.load(open(trace / "merged.json"))
    shifts = document["metadata"]["clock_shifts_s"]
    assert abs(shifts[os.path.join("server0", "comm.json")] - -SERVER_CLOCK_S) <= server["clock_error_s"], shifts
    assert shifts[os.path.join("machine0", "0", "comm.json")] == 0.0, shifts  # one clock: nothing to shift
    events = document["traceEvents"]
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(starts) == 80 and starts.keys() == ends.keys()
    # push -> receive and sum -> pull, each in order on the scheduler's clock, up to the server's stated error
    # bound (the merge corrects by the estimate, which is that close to the truth; 3 s off without it)
    bound_us = server["clock_error_s"] * 1e6
    for flow_id, start in starts.items():
        assert ends[flow_id]["ts"] >= start["ts"] - bound_us, (start, ends[flow_id], bound_us)


def test_local_aggregation_stages_are_traced_on_both_local_ranks(tmp_path):
    """Two machines of two processes: for each partition one local rank is its root (local_reduce, push, pull,
    local_broadcast, copy_out), the other copies in and waits for the broadcast, in that order across them."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER.replace('bps.push_pull(packed, name="packed", compression_params={"compressor": '
                                     '"onebit", "scaling": True})', "pass"))
    settings = {"BYTEPS_TRACE_ON": "1", "BYTEPS_TRACE_START_STEP": "1", "BYTEPS_TRACE_END_STEP": "4",
                "BYTEPS_TRACE_DIR": str(tmp_path / "trace"), "BYTEPS_PARTITION_BYTES": "4096"}
    result = launch_job(["--workers", "2", "-np", "2", "--servers", "1"], str(script), env=settings, timeout=60)
    assert result.returncode == 0, report(result)
    root_route, other_route = ("local_reduce", "push", "pull", "local_broadcast", "copy_out"), \
        ("copy_in", "local_broadcast", "copy_out")
    for machine in (0, 1):
        by_partition = defaultdict(dict)
        for local_rank in (0, 1):
            for e in _events(tmp_path / "trace" / f"machine{machine}" / str(local_rank) / "comm.json"):
                if e["cat"] != "tensor":
                    by_partition[(e["args"]["partition"], e["args"]["step"])].setdefault(local_rank, []).append(e)
        assert sorted(by_partition) == [(p, s) for p in range(3) for s in STEPS]
        for ranks in by_partition.values():
            routes = {rank: tuple(e["cat"] for e in sorted(stages, key=lambda e: e["ts"]))
                      for rank, stages in ranks.items()}
            assert sorted(routes.values()) == sorted([root_route, other_route]), routes
            root = next(rank for rank, route in routes.items() if route == root_route)
            stage = {(rank, e["cat"]): e for rank, stages in ranks.items() for e in stages}
            # the other rank's input is in before the root's sum of them ends; the pull before the broadcast ends
            assert stage[(1 - root, "copy_in")]["ts"] <= stage[(root, "local_reduce")]["ts"] + \
                stage[(root, "local_reduce")]["dur"] + 1
            pull = stage[(root, "pull")]
            assert pull["ts"] + pull["dur"] <= stage[(1 - root, "local_broadcast")]["ts"] + \
                stage[(1 - root, "local_broadcast")]["dur"] + 1


def test_the_png_gives_every_span_a_visible_width_and_counts_dense_ones(tmp_path):
    from byteps.launcher.trace import MIN_WIDTH_PX, draw

    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed (nox -s tests-launcher installs it)")
    # One long worker span of 1 s, and a server row of 400 answers of 20 us, 100 us apart, inside it.
    events = [{"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "worker 0"}},
              {"name": "process_name", "ph": "M", "pid": 1000, "tid": 0, "args": {"name": "server 0"}},
              {"name": "t", "cat": "tensor", "ph": "X", "pid": 0, "tid": 1, "ts": 0.0, "dur": 1e6, "args": {}}]
    events += [{"name": "x", "cat": "answer", "ph": "X", "pid": 1000, "tid": 3, "ts": 2e5 + 100.0 * i, "dur": 20.0,
                "args": {}} for i in range(400)]
    events += [{"name": "x", "cat": "answer", "ph": "X", "pid": 1000, "tid": 3, "ts": 9e5, "dur": 5.0, "args": {}}]
    picture = tmp_path / "t.png"
    layout = draw(events, str(picture))
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    answers = layout["server 0 · answer"]
    assert sum(count for _, _, count in answers) == 401  # every answer is drawn, alone or counted in a block
    min_width_ms = 1000.0 * MIN_WIDTH_PX / (12 * 110 * 0.8)
    assert all(width >= min_width_ms * 0.999 for _, width, _ in answers), answers
    assert answers[-1][2] == 1 and answers[-1][1] >= min_width_ms * 0.999  # a lone 5 us span still shows
    assert max(count for _, _, count in answers) > 1  # the dense ones are counted, not drawn on each other
    assert layout["worker 0 · tensor"] == [(0.0, 1000.0, 1)]
