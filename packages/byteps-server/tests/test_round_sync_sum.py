"""SyncSum, the synchronous round, driven directly over the real engine (no sockets, see round_driver.py)."""

import pytest
from round_driver import RoundDriver, spec_of

from byteps.common.tensor_description import TAG_GATHER
from byteps.server.rounds import SyncSum
from byteps.transport import Command
from byteps.transport.frames import FLAG_AVERAGE, FLAG_BARE, FLAG_PULL, FLAG_SKIPPED, FLAG_ZEROS


def test_sync_round_answers_every_pull_with_the_sum_once_every_machine_pushed():
    server = RoundDriver(machines=3)
    assert isinstance(server.declare(0, spec_of(3)), SyncSum)
    server.push(0, 0, 0, [1, 2, 3])
    server.pull(0, 0, 0)
    server.push(0, 1, 0, [10, 20, 30])
    server.pull(0, 1, 0)
    assert [s.command for s in server.take()] == [Command.PUSH_ACK, Command.PUSH_ACK]  # the round is open
    server.push(0, 2, 0, [100, 200, 300])
    sent = server.take()
    assert [(s.command, s.to) for s in sent] == [(Command.PUSH_ACK, 2), (Command.PULL_RESPONSE, 0),
                                                 (Command.PULL_RESPONSE, 1)]
    server.pull(0, 2, 0)  # after the round closed: answered at once
    assert server.answers() == {2: [111, 222, 333]}


def test_sync_round_acknowledges_each_push_but_not_one_that_carries_its_pull():
    server = RoundDriver(machines=2)
    policy = server.declare(0, spec_of(1))
    server.push(0, 0, 0, [1])
    server.push(0, 1, 0, [2], flags=FLAG_PULL)
    assert [(s.command, s.to) for s in server.take()] == [(Command.PUSH_ACK, 0)]
    server.push(0, 0, 1, [1], flags=FLAG_PULL)
    server.pull(0, 0, 1)  # the pull that push carried: kept, the round is open
    assert policy.is_waiting(b"rank-0", 1) and not policy.is_waiting(b"rank-1", 1)


def test_sync_round_holds_pulls_until_it_closes_and_refuses_rounds_that_cannot_exist():
    server = RoundDriver(machines=2)
    server.declare(0, spec_of(1))
    with pytest.raises(ValueError, match="pull of round 1 .* the last completed round is -1"):
        server.pull(0, 0, 1)
    server.push(0, 0, 0, [1])
    server.pull(0, 0, 0)
    with pytest.raises(ValueError, match="second pending pull"):
        server.pull(0, 0, 0)
    assert server.take(Command.PULL_RESPONSE) == []


def test_sync_round_refuses_a_second_push_from_the_same_machine():
    server = RoundDriver(machines=2)
    server.declare(0, spec_of(1))
    server.push(0, 0, 0, [1])
    with pytest.raises(ValueError, match="second push of round 0"):
        server.push(0, 0, 0, [1])


def test_sync_round_fails_every_pusher_when_one_averages_and_another_sums():
    server = RoundDriver(machines=3)
    server.declare(0, spec_of(1))
    server.push(0, 0, 0, [1], flags=FLAG_AVERAGE)
    server.push(0, 1, 0, [1], flags=FLAG_AVERAGE)
    server.take()
    with pytest.raises(ValueError, match="worker 2 sums but worker 0 averages"):
        server.push(0, 2, 0, [1])
    assert sorted(s.to for s in server.take(Command.ERROR)) == [0, 1]


def test_sync_round_releases_its_sum_once_every_pusher_has_its_answer():
    server = RoundDriver(machines=2)
    server.declare(0, spec_of(2))
    server.push(0, 0, 0, [1, 2])
    server.push(0, 1, 0, [3, 4])
    server.pull(0, 0, 0)
    assert server.engine.result(0, 0).nbytes == 8  # machine 1 has not pulled yet: still held
    server.pull(0, 1, 0)
    with pytest.raises(ValueError):
        server.engine.result(0, 0)


def test_sync_round_answers_a_bare_pull_with_a_header_alone():
    server = RoundDriver(machines=2)
    server.declare(0, spec_of(2))
    server.push(0, 0, 0, [1, 2])
    server.push(0, 1, 0, [3, 4])
    server.pull(0, 0, 0, flags=FLAG_BARE)
    server.pull(0, 1, 0)
    assert server.answers() == {0: None, 1: [4, 6]}


def test_sync_round_sums_a_push_flagged_zeros_as_zeros():
    server = RoundDriver(machines=2)
    server.declare(0, spec_of(2))
    server.push(0, 0, 0, [5, 6], aux=TAG_GATHER)
    server.push(0, 1, 0, flags=FLAG_ZEROS, aux=TAG_GATHER)
    server.pull(0, 1, 0)
    assert server.answers() == {1: [5, 6]}
    with pytest.raises(ValueError, match="flagged zeros must carry no payload"):
        server.push(0, 0, 1, [1, 1], flags=FLAG_ZEROS)


def test_sync_round_refuses_a_skipped_pull():
    server = RoundDriver(machines=2)
    server.declare(0, spec_of(1))
    with pytest.raises(ValueError, match="only a closed round of a key with backup workers can be skipped"):
        server.pull(0, 0, 0, flags=FLAG_SKIPPED)


def test_a_failed_round_forgets_its_pending_pulls():
    server = RoundDriver(machines=2)
    policy = server.declare(0, spec_of(1))
    server.push(0, 0, 0, [1])
    server.pull(0, 0, 0)
    policy.fail_round(0)
    assert not policy.is_waiting(b"rank-0", 0)


def test_partial_round_names_the_machines_that_pushed_the_open_round():
    server = RoundDriver(machines=3, local_size=2)
    policy = server.declare(0, spec_of(1))
    assert policy.partial_round() is None
    server.push(0, 1, 0, [1])  # rank 1: machine 0
    server.push(0, 5, 0, [1])  # rank 5: machine 2
    partial = policy.partial_round()
    assert (partial.key, partial.round, partial.pushed_ranks) == (0, 0, {0, 2})
