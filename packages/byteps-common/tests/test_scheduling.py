"""CreditQueue: priority order within a byte credit."""

import pytest

from byteps.common.engine.credit_queue import CreditQueue


def test_priority_order_then_arrival_order():
    queue = CreditQueue(0)
    for priority, name in [((3, 0), "c0"), ((1, 1), "a1"), ((1, 0), "a0"), ((3, 0), "c0-again"), ((2, 0), "b0")]:
        queue.add(priority, 10, name)
    assert list(queue.sendable()) == ["a0", "a1", "b0", "c0", "c0-again"]
    assert queue.in_flight_bytes == 50 and len(queue) == 0


def test_credit_bounds_the_bytes_in_flight_and_release_frees_it():
    queue = CreditQueue(credit_bytes=25)
    for index in range(5):
        queue.add((0, index), 10, index)
    assert list(queue.sendable()) == [0, 1]
    assert list(queue.sendable()) == []
    queue.add((-1, 0), 10, "urgent")  # arrives later, goes first once credit frees
    queue.release(10)
    assert list(queue.sendable()) == ["urgent"]
    queue.release(10)
    queue.release(10)
    assert list(queue.sendable()) == [2, 3]


def test_an_item_larger_than_the_credit_still_moves_alone():
    queue = CreditQueue(credit_bytes=4)
    queue.add((0,), 100, "big")
    queue.add((1,), 1, "small")
    assert list(queue.sendable()) == ["big"]
    queue.release(100)
    assert list(queue.sendable()) == ["small"]


def test_discard_removes_only_the_unwanted_and_keeps_the_order():
    queue = CreditQueue(credit_bytes=0)
    for priority, item in [((2,), "b"), ((1,), "a"), ((3,), "drop"), ((4,), "c"), ((0,), "drop")]:
        queue.add(priority, 1, item)
    queue.discard(lambda item: item == "drop")
    assert len(queue) == 3 and list(queue.sendable()) == ["a", "b", "c"]


def test_negative_credit_is_refused():
    with pytest.raises(ValueError, match="credit_bytes"):
        CreditQueue(-1)
