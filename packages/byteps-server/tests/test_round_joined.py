"""Join (hvd.join): joined machines count as zeros, per machine, driven over the real engine (round_driver.py)."""

import pytest
from round_driver import RoundDriver, spec_of

from byteps.common.tensor_description import TAG_GATHER
from byteps.server.rounds import JoinedMachines
from byteps.transport import Command
from byteps.transport.frames import FLAG_AVERAGE


def test_a_joined_machine_counts_as_zeros_in_the_round_in_progress_and_the_later_ones():
    server = RoundDriver(machines=3)
    server.declare(0, spec_of(2))
    server.push(0, 0, 0, [1, 2])
    server.pull(0, 0, 0)
    server.join(2)  # machine 2 ran out of data: round 0 takes its zeros, and still waits for machine 1
    assert server.answers() == {}
    server.push(0, 1, 0, [10, 20])
    server.pull(0, 1, 0)
    assert server.answers() == {0: [11, 22], 1: [11, 22]}
    # Round 1: machine 2's zeros are pushed as soon as a machine that has not joined pushes.
    server.push(0, 1, 1, [5, 5])
    server.push(0, 0, 1, [1, 1])
    server.pull(0, 0, 1)
    assert server.answers() == {0: [6, 6]}


def test_joins_are_per_machine_with_two_worker_processes_per_machine():
    # Two machines of two processes: ranks 0, 1 are machine 0, ranks 2, 3 machine 1. Machine 1 pushes the key
    # from whichever of its ranks is the partition's local root; machine 0's JOIN comes from one of its ranks.
    server = RoundDriver(machines=2, local_size=2)
    server.declare(0, spec_of(1))
    server.push(0, 2, 0, [7])
    with pytest.raises(ValueError, match="second push of round 0"):
        server.push(0, 3, 0, [7])  # machine 1 pushed round 0 already, through rank 2
    server.pull(0, 2, 0)
    server.join(0)  # machine 0, while machine 1 pushes: round 0 takes its zeros and closes
    assert server.answers() == {2: [7]}
    with pytest.raises(ValueError, match=r"worker 1 \(machine 0, which joined as worker 0\) joined twice"):
        server.join(1)
    server.push(0, 3, 1, [8])  # rank 3, the same machine: closed at once with machine 0's zeros
    server.pull(0, 3, 1)
    assert server.answers() == {3: [8]}
    server.push(0, 2, 2, [9])
    server.pull(0, 2, 2)
    assert server.answers() == {2: [9]}
    server.join(3)  # every machine joined: they are all forgotten
    assert not server.services.joined


def test_a_second_push_of_a_machine_is_refused_across_its_processes():
    server = RoundDriver(machines=2, local_size=2)
    server.declare(0, spec_of(1))
    server.push(0, 0, 0, [1])
    with pytest.raises(ValueError, match="second push of round 0"):
        server.push(0, 1, 0, [1])


def test_a_join_before_a_round_started_adds_nothing_until_a_machine_pushes_it():
    server = RoundDriver(machines=2)
    policy = server.declare(0, spec_of(1))
    server.join(1)
    assert policy.partial_round() is None and server.engine.completed_round(0) == -1
    server.push(0, 0, 0, [4], flags=FLAG_AVERAGE)
    server.pull(0, 0, 0)
    assert server.answers() == {0: [4]}


def test_a_push_from_a_joined_machine_starts_a_round_that_takes_no_zeros():
    # The last JOIN may reach this server after a joined machine's first push past the join (they travel on
    # different connections): that round is a new one, which every machine pushes.
    server = RoundDriver(machines=3)
    server.declare(0, spec_of(1))
    server.join(0)
    server.join(1)
    server.push(0, 0, 0, [1])  # machine 0, joined: its join returned, so machine 2's JOIN is on its way
    server.push(0, 1, 0, [2])
    assert server.engine.completed_round(0) == -1
    server.join(2)  # every machine joined: forgotten
    server.push(0, 2, 0, [4])
    server.pull(0, 2, 0)
    assert server.answers() == {2: [7]}


def test_a_round_that_gathers_completes_but_fails_its_pulls_after_a_machine_joined():
    server = RoundDriver(machines=2)
    server.declare(0, spec_of(1))
    server.push(0, 0, 0, [1], aux=TAG_GATHER)
    server.pull(0, 0, 0)
    server.join(1)
    errors = server.take(Command.ERROR)
    assert [e.to for e in errors] == [0] and b"but worker 1 has joined (hvd.join())" in errors[0].payload
    assert b"gathers" in errors[0].payload
    with pytest.raises(ValueError, match="only allreduces count a joined rank as zeros"):
        server.pull(0, 0, 0)


def test_a_process_set_key_takes_no_zeros_for_a_joined_machine():
    server = RoundDriver(machines=3)
    server.declare(0, spec_of(1, contributors=2), ranks=[0, 1])
    server.push(0, 0, 0, [1])
    server.join(2)
    server.join(1)
    assert server.engine.completed_round(0) == -1  # the set's round waits for its machines, joined or not


def test_a_join_from_outside_the_job_or_twice_is_refused():
    joined = JoinedMachines(num_machines=2, local_size=1)
    with pytest.raises(ValueError, match="not a worker of this job's 2 machines"):
        joined.join(2)
    assert joined.join(0)
    with pytest.raises(ValueError, match="worker 0 joined twice before every worker joined"):
        joined.join(0)
    assert not joined.join(1) and not joined
