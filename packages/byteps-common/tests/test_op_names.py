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


def test_layouts_number_by_first_use_and_a_join_starts_the_uses_afresh():
    """Without a worker: a name's first use and uses of the layout in use announce nothing (an announcement
    would need the worker, which raises here); after a join, neither does the next use of any layout."""
    names = TensorNames()
    a, b, c = ((2,), "float32"), ((3,), "float32"), ((4,), "int32")
    assert names.key("w", a) == "w" and names.key("w", a) == "w"
    assert names.key("w", b, scope=2) == "w#1"  # a process set's first use: its own layout in use, nothing to tell
    with pytest.raises(ValueError, match="init"):
        names.key("w", b)  # a switch in the global set: announced, and there is no worker to announce with
    assert names.key("w", a) == "w"  # the refused switch changed nothing
    # Another rank went on to use "w" with c while this one had joined (join_state(): its layout list).
    names.adopt_layouts({"w": [repr(a), repr(b), repr(c)]})
    assert names.key("w", c) == "w#2" and names.key("w", c, scope=2) == "w#2"


def test_a_retired_tensor_takes_its_layout_and_the_layout_in_use_with_it():
    """The core retires a tensor whose first round failed on every rank (each rank used the name with a layout
    of its own): the name's next use, with any layout, numbers it as the others do and announces nothing (an
    announcement would need the worker, which raises here)."""
    from byteps.common.frontend.names import forget_retired

    names = TensorNames()
    a, b, c = ((2,), "float32"), ((3,), "float32"), ((4,), "int32")
    assert names.key("r", a) == "r"
    forget_retired("r")   # a's first round failed: the other rank had used "r" with b
    assert names.layouts().get("r") is None and names.key("r", c) == "r"
    assert names.key("r", b, scope=5) == "r#1"   # c is in use in set 0; b is set 5's first use
    forget_retired("r#1 (every machine) (process set 5)")   # backup workers' tensor of a process set's op
    forget_retired("r#1 (process set 5)")   # once: it is no longer the last layout
    assert names.layouts()["r"] == [repr(c)] and names.key("r", a, scope=5) == "r#1"
    forget_retired("r#7")   # not a layout this adapter added last: nothing
    assert names.layouts()["r"] == [repr(c), repr(a)]
