"""QuorumSum (backup workers), with and without join, driven over the real engine (round_driver.py)."""

import pytest
from round_driver import RoundDriver, spec_of

from byteps.common.tensor_description import split_quorum_aux
from byteps.server.rounds import BACKUP_MAX_LAG, QuorumSum
from byteps.transport import Command
from byteps.transport.frames import FLAG_AVERAGE, FLAG_PULL, FLAG_SKIPPED


def quorum_server(machines=3, quorum=2):
    server = RoundDriver(machines=machines)
    policy = server.declare(0, spec_of(1, quorum=quorum))
    assert isinstance(policy, QuorumSum)
    return server, policy


def round_of(server, round_, ranks, value=1.0):
    """Each of ``ranks`` pushes ``round_`` (rank r pushes value * 10**r) and pulls it."""
    for rank in ranks:
        server.push(0, rank, round_, [value * 10 ** rank], flags=FLAG_AVERAGE)
    for rank in ranks:
        server.pull(0, rank, round_)


def test_quorum_round_closes_at_the_quorum_and_drops_the_late_push():
    server, policy = quorum_server()
    round_of(server, 0, [0, 1])
    round_of(server, 1, [0, 1], value=2.0)
    sent = server.take(Command.PULL_RESPONSE)
    assert [(s.to, s.round, split_quorum_aux(s.aux)) for s in sent] == [(0, 0, (2, 0)), (1, 0, (2, 0)),
                                                                       (0, 1, (2, 0)), (1, 1, (2, 0))]
    server.push(0, 2, 0, [100.0], flags=FLAG_AVERAGE)  # late: acknowledged, dropped, counted
    assert [(s.command, s.to) for s in server.take()] == [(Command.PUSH_ACK, 2)]
    assert server.services.late_pushes == 1
    server.pull(0, 2, 0)  # answered with round 0's sum, the one the others got; one round closed after it
    sent = server.take(Command.PULL_RESPONSE)
    assert [(s.round, split_quorum_aux(s.aux)) for s in sent] == [(0, (2, 1))]


def test_quorum_late_pull_gets_exactly_the_sum_the_others_got():
    server, _ = quorum_server()
    round_of(server, 0, [0, 1])
    assert server.answers() == {0: [11.0], 1: [11.0]}
    server.push(0, 2, 0, [100.0], flags=FLAG_AVERAGE | FLAG_PULL)
    server.pull(0, 2, 0)
    assert server.answers() == {2: [11.0]}


def test_quorum_answers_wait_while_a_machine_lags_more_than_the_bound():
    server, policy = quorum_server()
    for round_ in range(BACKUP_MAX_LAG + 1):
        round_of(server, round_, [0, 1])
    answered = sorted({s.round for s in server.take(Command.PULL_RESPONSE)})
    assert answered == list(range(BACKUP_MAX_LAG))  # machine 2 pushed nothing yet: the last round waits
    assert policy.is_waiting(b"rank-0", BACKUP_MAX_LAG)
    server.push(0, 2, 0, [100.0], flags=FLAG_AVERAGE)  # it moves (late): the held round may go
    assert sorted((s.to, s.round) for s in server.take(Command.PULL_RESPONSE)) == [(0, BACKUP_MAX_LAG),
                                                                                     (1, BACKUP_MAX_LAG)]


def test_quorum_skipped_pull_gets_the_closed_round_and_moves_the_machine_past_it():
    server, policy = quorum_server()
    round_of(server, 0, [0, 1])
    round_of(server, 1, [0, 1], value=2.0)
    server.take()
    server.pull(0, 2, 0, flags=FLAG_SKIPPED)
    assert server.answers() == {2: [11.0]}
    server.pull(0, 2, 1, flags=FLAG_SKIPPED)
    assert server.answers() == {2: [22.0]}
    assert sorted(policy.history) == [1]  # every machine is past round 0: never pulled again


def test_quorum_refuses_a_skipped_pull_of_a_round_that_is_not_closed():
    server, _ = quorum_server()
    server.push(0, 0, 0, [1.0], flags=FLAG_AVERAGE)
    with pytest.raises(ValueError, match="skipped pull of round 0"):
        server.pull(0, 2, 0, flags=FLAG_SKIPPED)


def test_a_quorum_not_below_the_machines_is_refused():
    server = RoundDriver(machines=3)
    with pytest.raises(ValueError, match="a quorum must be below the 3 machines"):
        server.declare(0, spec_of(1, quorum=3))


# --- with join --------------------------------------------------------------------------------
def test_a_joined_machine_is_left_out_of_the_lag_bound():
    server, policy = quorum_server()
    server.join(2)  # machine 2 pushes no more: nobody waits for it
    for round_ in range(2 * BACKUP_MAX_LAG):
        round_of(server, round_, [0, 1])
    assert sorted({s.round for s in server.take(Command.PULL_RESPONSE)}) == list(range(2 * BACKUP_MAX_LAG))
    assert sorted(policy.history) == [2 * BACKUP_MAX_LAG - 1]  # what the live machines are past is forgotten


def test_a_join_releases_the_pulls_the_joined_machine_held_back():
    server, policy = quorum_server()
    for round_ in range(BACKUP_MAX_LAG + 1):
        round_of(server, round_, [0, 1])
    server.take()
    assert policy.is_waiting(b"rank-0", BACKUP_MAX_LAG)
    server.join(2)
    assert sorted((s.to, s.round) for s in server.take(Command.PULL_RESPONSE)) == [(0, BACKUP_MAX_LAG),
                                                                                     (1, BACKUP_MAX_LAG)]


def test_quorum_rounds_close_at_the_quorum_of_machines_that_have_not_joined():
    server, _ = quorum_server(machines=4, quorum=2)
    server.join(3)  # 3 machines left, quorum 2: nothing to pad
    server.push(0, 0, 0, [1.0], flags=FLAG_AVERAGE)
    assert server.engine.completed_round(0) == -1
    server.push(0, 1, 0, [10.0], flags=FLAG_AVERAGE)
    server.pull(0, 0, 0)
    sent = server.take(Command.PULL_RESPONSE)
    assert [split_quorum_aux(s.aux) for s in sent] == [(2, 0)]


def test_quorum_round_closes_padded_with_zeros_when_fewer_machines_than_the_quorum_are_left():
    server, _ = quorum_server(machines=4, quorum=3)
    server.join(2)
    server.join(3)  # 2 machines left for a quorum of 3
    server.push(0, 0, 0, [1.0], flags=FLAG_AVERAGE)
    server.pull(0, 0, 0)
    assert server.take(Command.PULL_RESPONSE) == []  # machine 1 has not pushed: the round waits for it
    server.push(0, 1, 0, [10.0], flags=FLAG_AVERAGE)
    server.pull(0, 1, 0)
    sent = server.take(Command.PULL_RESPONSE)
    # Padded with one machine's zeros: the answer says 3 machines, so the average divides by the quorum.
    assert [(s.to, split_quorum_aux(s.aux)) for s in sent] == [(0, (3, 0)), (1, (3, 0))]
    assert server.take() == []


def test_a_join_closes_the_quorum_rounds_that_only_joined_machines_held_open():
    server, policy = quorum_server(machines=4, quorum=3)
    server.join(3)  # 3 machines left: the quorum still needs each of them
    server.push(0, 0, 0, [1.0], flags=FLAG_AVERAGE)
    server.push(0, 1, 0, [10.0], flags=FLAG_AVERAGE)
    server.pull(0, 0, 0)
    assert policy.partial_round().pushed_ranks == {0, 1}
    server.join(2)  # now 2 left, and both pushed round 0: it closes with zeros for the quorum
    assert server.answers() == {0: [11.0]}
    assert policy.partial_round() is None


def test_a_quorum_key_refuses_a_round_that_sums_or_broadcasts():
    """Only averages over every worker may close without the late machines: anything else is an error, never a
    round that silently misses machines (workers give such rounds a tensor of their own)."""
    server, _ = quorum_server()
    with pytest.raises(ValueError, match="a push that sums from worker 0.* only averages over every worker may"):
        server.push(0, 0, 0, [1.0])
    with pytest.raises(ValueError, match="a push that broadcasts from rank 1 from worker 0"):
        server.push(0, 0, 0, [1.0], flags=FLAG_AVERAGE, aux=2)
    assert not server.take(Command.PUSH_ACK)
