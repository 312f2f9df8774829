"""When an adapter's op name is free again (byteps.common.frontend: TensorNames and OpTracker).

A user's name stays in flight until its handle is synchronized, so that a
second op of the name is refused on every rank however fast the first one
finished; a default name and a failed op's name are freed when the op ends. An unnamed op's slot (which
default name the next unnamed op gets) is held until its handle is synchronized.
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


def unnamed(tracker: OpTracker, family: str = "slots") -> tuple:
    name = tracker.names.default(family)
    core, handle = start(tracker, name)
    return name, core, handle


def test_blocking_unnamed_ops_reuse_one_name():
    """An unnamed op's slot is free again once its handle is synchronized: a script of blocking unnamed calls
    uses one name (one byteps tensor per shape), not a new one per call."""
    tracker = OpTracker(TensorNames())
    for _ in range(40):
        name, core, handle = unnamed(tracker, "blocking")
        assert name == "blocking.noname.0"
        core.set_done()
        tracker.handles.synchronize(handle)


def test_an_unnamed_ops_slot_is_held_until_synchronize_not_until_its_end():
    """Ops end at different times on different ranks; synchronize() is where the program is, the same on every
    rank. So an op that has ended but is not synchronized still holds its slot."""
    tracker = OpTracker(TensorNames())
    first, core0, handle0 = unnamed(tracker)
    second, core1, handle1 = unnamed(tracker)
    assert (first, second) == ("slots.noname.0", "slots.noname.1")
    core0.set_done()
    third, core2, handle2 = unnamed(tracker)
    assert third == "slots.noname.2"  # slot 0's op ended but was not synchronized
    tracker.handles.synchronize(handle0)
    fourth, core3, _ = unnamed(tracker)
    assert fourth == "slots.noname.0"
    core1.set_done()
    core2.set_done()
    core3.set_done()
    tracker.handles.synchronize(handle2)
    assert unnamed(tracker)[0] == "slots.noname.2"  # the lowest free slot, whichever was freed first


def test_with_every_slot_held_an_unnamed_op_takes_the_one_held_longest():
    """Handles never synchronized: unnamed ops cycle through the window's names (memory stays flat), each
    waiting for the op whose name it takes to end; a late synchronize() of a handle whose slot was taken
    frees nothing."""
    from byteps.common.frontend.names import DEFAULT_NAME_WINDOW

    tracker = OpTracker(TensorNames())
    ops = [unnamed(tracker, "leaky") for _ in range(DEFAULT_NAME_WINDOW)]
    assert [name for name, _, _ in ops] == [f"leaky.noname.{i}" for i in range(DEFAULT_NAME_WINDOW)]
    for _, core, _ in ops:
        core.set_done()
    again = [unnamed(tracker, "leaky") for _ in range(3)]
    assert [name for name, _, _ in again] == ["leaky.noname.0", "leaky.noname.1", "leaky.noname.2"]
    tracker.handles.synchronize(ops[0][2])  # slot 0 belongs to again[0] now
    assert unnamed(tracker, "leaky")[0] == "leaky.noname.3"
    again[0][1].set_done()
    tracker.handles.synchronize(again[0][2])
    assert unnamed(tracker, "leaky")[0] == "leaky.noname.0"


def test_a_refused_unnamed_call_gives_its_name_to_the_next_one():
    """A call refused before it started (bad input on this rank) holds no slot: the next unnamed call gets the
    name the others' matching call got."""
    names = TensorNames()
    name = names.default("refused")
    names.free_slot(name, refused=True)  # refused before reserve()
    assert names.default("refused") == name
    token = names.reserve(name, "allreduce()")
    names.release(name, token)
    names.free_slot(name, token, refused=True)  # refused after it
    assert names.default("refused") == name


def test_a_join_frees_every_slot():
    from byteps.common.frontend.names import adopt_join_states, join_state

    tracker = OpTracker(TensorNames())
    for _ in range(2):
        unnamed(tracker, "joined")[1].set_done()  # ended, not synchronized: both slots held
    adopt_join_states([join_state()])
    assert unnamed(tracker, "joined")[0] == "joined.noname.0"


def blocking_calls(layouts: list) -> list:
    """The slots blocking unnamed calls of ``layouts`` (in order) get from a fresh DefaultSlots."""
    from byteps.common.frontend.default_slots import DefaultSlots

    slots, taken = DefaultSlots(), []
    for layout in layouts:
        slot, op = slots.take("f")
        slots.record("f", op, layout)
        slots.free("f", slot, op)
        taken.append(slot)
    return taken


def switches(layouts: list, taken: list) -> int:
    """How many calls used a slot whose last use had another layout (each announces a switch)."""
    last: dict = {}
    count = 0
    for layout, slot in zip(layouts, taken):
        count += slot in last and last[slot] != layout
        last[slot] = layout
    return count


def test_a_repeating_pattern_of_shapes_settles_on_a_name_per_shape():
    """A gradient and a metric allreduced unnamed every step: after a few calls each shape keeps a name of its
    own, so no call announces a switch; one shape keeps slot 0; a pattern too long to see repeat uses slot 0."""
    assert blocking_calls(["g"] * 10) == [0] * 10
    pattern = ["g", "m"] * 10
    taken = blocking_calls(pattern)
    assert taken[-6:] == [0, 1] * 3 and switches(pattern[6:], taken[6:]) == 0, taken
    three = ["a", "a", "b"] * 8
    taken = blocking_calls(three)
    assert switches(three[9:], taken[9:]) == 0 and len(set(taken[9:])) == 3, taken
    long = [str(i) for i in range(12)] * 3   # longer than MAX_PERIOD: one name, a switch each call
    assert set(blocking_calls(long)) == {0}


def test_a_refused_call_is_taken_back_from_the_pattern():
    """A rank whose call was refused (bad input there) must choose as the ranks that never made it."""
    from byteps.common.frontend.default_slots import DefaultSlots

    pattern = ["g", "m"] * 4
    refusing = DefaultSlots()
    for i, layout in enumerate(pattern):
        slot, op = refusing.take("f")
        if i == 5:
            refusing.record("f", op, "bad")
            refusing.free("f", slot, op, taken_back=True)
            slot, op = refusing.take("f")
        refusing.record("f", op, layout)
        refusing.free("f", slot, op)
    other = blocking_calls(pattern + ["g"])[-1]
    assert refusing.take("f")[0] == other


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
