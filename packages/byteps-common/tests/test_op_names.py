"""When an adapter's op name is free again (byteps.common.frontend: TensorNames and OpTracker).

A user's name stays in flight until its handle is synchronized, so that a
second op of the name is refused on every rank however fast the first one
finished; a default name and a failed op's name are freed when the op ends.
The multi-rank form of the same rule runs in byteps-torch's ops checks.
"""

from __future__ import annotations

import pytest

from byteps.common.frontend.handle_table import OpTracker
from byteps.common.frontend.names import TensorNames
from byteps.common.handle import Handle


def start(tracker: OpTracker, name: str) -> tuple:
    token = tracker.names.reserve(name, f"allreduce({name!r})")
    core = Handle(name, output=None)
    return core, tracker.track(core, name, token, 0.0, 4, finish=lambda: "result")


def test_a_finished_op_holds_its_name_until_synchronized():
    tracker = OpTracker(TensorNames())
    core, handle = start(tracker, "grad")
    core.set_done()
    assert tracker.handles.poll(handle)
    with pytest.raises(ValueError, match="still in flight; synchronize"):
        tracker.names.reserve("grad", "allreduce('grad')")
    assert tracker.handles.synchronize(handle) == "result"
    start(tracker, "grad")  # free again


def test_a_failed_op_frees_its_name_at_once():
    tracker = OpTracker(TensorNames())
    core, handle = start(tracker, "grad")
    core.set_error(RuntimeError("ranks disagree"))
    start(tracker, "grad")  # the caller may give up on the failed handle and go on
    with pytest.raises(RuntimeError, match="ranks disagree"):
        tracker.handles.synchronize(handle)


def test_a_default_name_is_free_when_its_op_ends():
    tracker = OpTracker(TensorNames())
    name = tracker.names.default("allreduce")
    token = tracker.names.reserve(name, "allreduce()")
    core = Handle(name, output=None)
    tracker.track(core, name, token, 0.0, 4, finish=lambda: None)
    core.set_done()
    # a later unnamed op of the same default name waits for this one's end, not for its synchronize()
    tracker.names.reserve(name, "allreduce()")
