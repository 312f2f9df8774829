"""The stall inspector: unit behaviour, and a real job where one worker never pushes a tensor."""

import sys

from byteps.server.stall_inspector import PartialRound, StallInspector
from byteps.testkit import run_job


def test_partitions_of_a_tensor_are_reported_once_with_the_missing_ranks(caplog):
    inspector = StallInspector(check_s=10, shutdown_s=0, num_workers=4)
    parts = [PartialRound(key=k, name="w", round=3, started=100.0, pushed_ranks={0, 2}) for k in (1, 2)]
    assert inspector.inspect(parts, now=105) == [] and not caplog.records  # not yet
    with caplog.at_level("WARNING"):
        assert inspector.inspect(parts, now=111) == []
        inspector.inspect(parts, now=200)  # reported once per tensor round
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1
    assert "tensor 'w' round 3 stalled for 11 s: worker ranks [1, 3] have not pushed it (ranks [0, 2] have)" \
        in messages[0]


def test_shutdown_time_returns_the_fatal_stalls():
    inspector = StallInspector(check_s=0, shutdown_s=30, num_workers=2)
    stalls = inspector.inspect([PartialRound(5, "b", 0, 0.0, {1})], now=31)
    assert [(s.name, s.missing, s.keys) for s in stalls] == [("b", (0,), (5,))]


SKIPPER = r"""
import time
import numpy as np
import byteps.common as bps
bps.init()
bps.declare("a"); bps.declare("b")
if bps.rank() == 0:
    try:
        bps.push_pull(np.ones(8, np.float32), name="b")   # rank 1 never pushes "b"
    except bps.PushPullError as exc:
        print("FAILED:", exc, flush=True)
        raise SystemExit(1)
else:
    time.sleep(30)
"""


def test_a_tensor_only_some_ranks_push_is_named_and_ends_the_job():
    result = run_job([sys.executable, "-c", SKIPPER], 2, 1, timeout=60,
                     env={"BYTEPS_STALL_CHECK_TIME": "1", "BYTEPS_STALL_SHUTDOWN_TIME": "3"})
    server = result.outputs["server0"]
    assert "stall inspector: tensor 'b' round 0 stalled for" in server, server
    assert "worker ranks [1] have not pushed it (ranks [0] have)" in server
    assert result.codes["server0"] == 1 and "BYTEPS_STALL_SHUTDOWN_TIME=3" in server
    worker0 = result.outputs["worker0"]
    assert result.codes["worker0"] == 1 and "worker ranks [1] have not pushed it" in worker0, worker0


OP_MISMATCH = r"""
import numpy as np
import byteps.common as bps
bps.init()
try:
    bps.push_pull(np.ones(8, np.float32), name="g", average=bps.rank() == 0)
except bps.PushPullError as exc:
    print("FAILED:", exc, flush=True)
    raise SystemExit(1)
print("no error: silently wrong", flush=True)
"""

ORDER_MISMATCH = r"""
import numpy as np
import byteps.common as bps
bps.init()
names = ["alpha", "beta"] if bps.rank() == 0 else ["beta", "alpha"]
try:
    for name in names:
        bps.push_pull(np.ones(8, np.float32), name=name)
except bps.PushPullError as exc:
    print("FAILED:", exc, flush=True)
    raise SystemExit(1)
print("no error: silently wrong", flush=True)
"""


def test_average_on_one_rank_and_sum_on_another_fails_everywhere():
    result = run_job([sys.executable, "-c", OP_MISMATCH], 2, 1, timeout=60)
    for rank in (0, 1):
        out = result.outputs[f"worker{rank}"]
        assert result.codes[f"worker{rank}"] == 1, out
        assert "averages" in out and "sums" in out and "same op" in out, out


def test_different_declaration_order_fails_everywhere_naming_both_tensors():
    result = run_job([sys.executable, "-c", ORDER_MISMATCH], 2, 1, timeout=60)
    for rank in (0, 1):
        out = result.outputs[f"worker{rank}"]
        assert result.codes[f"worker{rank}"] == 1, out
        assert "tensor 'alpha'" in out and "tensor 'beta'" in out, out
