"""AsyncStore (BYTEPS_ENABLE_ASYNC), driven over the real engine (round_driver.py)."""

import pytest
from round_driver import RoundDriver, spec_of

from byteps.server.rounds import AsyncStore
from byteps.transport import Command
from byteps.transport.frames import FLAG_PULL


def async_server(staleness=None):
    server = RoundDriver(machines=2, staleness=staleness)
    policy = server.declare(0, spec_of(2, asynchronous=True))
    assert isinstance(policy, AsyncStore)
    # Round 0, the broadcast from rank 0: the other rank pushes zeros; the sum is the store's first value.
    server.push(0, 0, 0, [1, 2])
    server.push(0, 1, 0, [0, 0])
    server.pull(0, 0, 0)
    server.pull(0, 1, 0)
    assert server.answers() == {0: [1, 2], 1: [1, 2]}
    return server, policy


def test_async_store_starts_from_the_round_0_broadcast():
    _, policy = async_server()
    assert policy.store.view("float32").tolist() == [1, 2]


def test_async_store_applies_each_delta_once_in_order():
    server, policy = async_server()
    server.push(0, 0, 1, [10, 10])
    assert policy.store.view("float32").tolist() == [11, 12]  # at once: no round waits for rank 1
    with pytest.raises(ValueError, match="asynchronous push of round 1 .* expected round 2"):
        server.push(0, 0, 1, [10, 10])  # the same delta twice
    with pytest.raises(ValueError, match="asynchronous push of round 2 .* expected round 1"):
        server.push(0, 1, 2, [10, 10])  # rank 1 skipped its round 1
    server.push(0, 1, 1, [100, 100])
    server.push(0, 0, 2, [1000, 1000])
    assert policy.store.view("float32").tolist() == [1111, 1112]
    assert server.services.async_pushes == 3
    assert [s.command for s in server.take()] == [Command.PUSH_ACK] * 3


def test_async_pull_is_answered_at_once_with_the_store_as_it_is():
    server, _ = async_server()
    server.push(0, 0, 1, [10, 10], flags=FLAG_PULL)
    server.pull(0, 0, 1)
    assert server.answers() == {0: [11, 12]}
    server.push(0, 1, 1, [5, 5])
    server.pull(0, 1, 1)
    assert server.answers() == {1: [16, 17]}


def test_async_pull_waits_while_the_puller_is_more_than_the_staleness_bound_ahead():
    server, policy = async_server(staleness=1)
    server.push(0, 0, 1, [1, 1])
    server.pull(0, 0, 1)  # 1 ahead of rank 1: within the bound
    assert server.answers() == {0: [2, 3]}
    server.push(0, 0, 2, [1, 1])
    server.pull(0, 0, 2)  # 2 ahead: held until rank 1 moves
    assert server.answers() == {} and policy.is_waiting(b"rank-0", 2)
    server.push(0, 1, 1, [10, 10])
    assert server.answers() == {0: [13, 14]}
    assert not policy.is_waiting(b"rank-0", 2)


def test_async_pull_before_its_push_is_refused():
    server, _ = async_server()
    with pytest.raises(ValueError, match="pull of round 1 .* before its push"):
        server.pull(0, 0, 1)


def test_async_delta_before_the_broadcast_completed_is_refused():
    server = RoundDriver(machines=2)
    server.declare(0, spec_of(2, asynchronous=True))
    server.push(0, 0, 0, [1, 2])
    with pytest.raises(ValueError, match="after the initial broadcast"):
        server.push(0, 0, 1, [1, 1])
