"""Each stage of the engine on its own: what it answers the dispatcher, and when it finishes.

A stage finishes now (DONE), waits for a message its owner receives (WAIT,
then a later receive() hands the trip back), or asks the dispatcher to wait
for GPU work or run a codec off the thread. These tests drive one owner at a
time over real sockets: the exchange against a listener this test answers
by hand (the wire a server speaks), the local group's two ranks over their
real local channel, in one process. The jobs in test_local_aggregation.py
and test_end_to_end.py run the same stages through real servers.
"""

from __future__ import annotations

import itertools
import uuid

import numpy as np
import pytest

from byteps.common.buffers import input_and_output_views
from byteps.common.engine.copy_out import CopyOut
from byteps.common.engine.device import DeviceCopyDone, DeviceStages
from byteps.common.engine.exchange import ServerExchange
from byteps.common.engine.local import LocalGroup
from byteps.common.engine.route import Placement, Role, Stage, plan_route
from byteps.common.engine.stage import DONE, WAIT, Failure, KeyRefused
from byteps.common.engine.task import PartitionTrip, PushPullTask
from byteps.common.handle import Handle
from byteps.common.options import PushPullOptions
from byteps.common.partition import PartitionPlan
from byteps.common.tensor_description import quorum_aux
from byteps.transport import FLAG_BARE, FLAG_PULL, FLAG_SKIPPED, Command, Context

_ids = itertools.count(1)


def make_task(values, average_over=0, round_=0, servers=1, partition_bytes=1 << 20, **fields):
    source, output = input_and_output_views(values, fields.pop("output", None), "test", None)
    plan = PartitionPlan.build(next(_ids), source.nbytes, source.dtype.itemsize, partition_bytes, servers)
    options = fields.pop("options", PushPullOptions(average=bool(average_over)))
    return PushPullTask(name="t", round=round_, source=source, output=output, plan=plan, handle=Handle("t", None),
                        options=options, average_over=average_over, **fields)


def trip_at(task, stage, role=Role.ALONE, servers=True, index=0, placement=Placement.HOST):
    route = plan_route(role, servers, task.compression is not None, placement)
    trip = PartitionTrip(task, task.plan.partitions[index], route)
    trip.position = route.stages.index(stage)
    return trip


@pytest.fixture
def wire():
    """A ServerExchange connected to a listener the test answers (the wire of one server)."""
    context = Context()
    listener = context.listen("tcp://127.0.0.1:0", 1 << 22)

    def exchange(pipeline=True, credit=0):
        return ServerExchange(context, [("127.0.0.1", listener.port)], 0, 1 << 22, credit, pipeline, alone=True)

    yield listener, exchange
    listener.close(0)
    context.close()


def receive_all(listener, count):
    messages = [listener.recv() for _ in range(count)]
    return messages


def test_exchange_stage_waits_for_the_answer_then_proceeds(wire):
    listener, make = wire
    exchange = make()
    task = make_task(np.arange(8, dtype=np.float32))
    trip = trip_at(task, Stage.EXCHANGE)
    assert exchange.exchange(trip) is WAIT
    init, push = receive_all(listener, 2)
    assert (init.header.command, push.header.command) == (Command.INIT_KEY, Command.PUSH)
    assert push.header.flags & FLAG_PULL  # pipelined: the push carries its pull
    assert np.array_equal(np.frombuffer(push.payload, np.float32), np.arange(8))
    listener.send(Command.PULL_RESPONSE, 9, push.header.key, 0, payload=np.full(8, 2, np.float32),
                  dtype=push.header.dtype, identity=push.identity)
    assert exchange.connections[0].wait_readable(5)
    assert exchange.receive(exchange.connections[0]) == [trip]
    # nothing to divide: the sum landed straight in the output
    assert trip.data is trip.output and np.array_equal(task.output.array, np.full(8, 2, np.float32))
    exchange.close(0)


def test_exchange_holds_an_average_as_the_message_for_copy_out_to_divide(wire):
    listener, make = wire
    exchange = make()
    task = make_task(np.ones(4, dtype=np.float32), average_over=2)
    trip = trip_at(task, Stage.EXCHANGE)
    exchange.exchange(trip)
    _, push = receive_all(listener, 2)
    listener.send(Command.PULL_RESPONSE, 9, push.header.key, 0, payload=np.full(4, 6, np.float32),
                  dtype=push.header.dtype, identity=push.identity)
    exchange.connections[0].wait_readable(5)
    assert exchange.receive(exchange.connections[0]) == [trip]
    assert trip.data is not trip.output
    trip.position += 1
    assert CopyOut().copy_out(trip) is DONE
    assert np.array_equal(task.output.array, np.full(4, 3, np.float32))


def test_exchange_unpipelined_pulls_only_after_every_push_was_acknowledged(wire):
    listener, make = wire
    exchange = make(pipeline=False)
    task = make_task(np.arange(8, dtype=np.float32), partition_bytes=16)  # 2 partitions
    task.network_partitions = 2
    trips = [trip_at(task, Stage.EXCHANGE, index=i) for i in range(2)]
    for trip in trips:
        assert exchange.exchange(trip) is WAIT
    pushes = [m for m in receive_all(listener, 4) if m.header.command == Command.PUSH]
    assert len(pushes) == 2 and not any(p.header.flags & FLAG_PULL for p in pushes)
    listener.send(Command.PUSH_ACK, 9, pushes[0].header.key, 0, identity=pushes[0].identity)
    exchange.connections[0].wait_readable(5)
    assert exchange.receive(exchange.connections[0]) == ()
    assert not listener.wait_readable(0.2)  # one push still unacknowledged: no pull yet
    listener.send(Command.PUSH_ACK, 9, pushes[1].header.key, 0, identity=pushes[1].identity)
    exchange.connections[0].wait_readable(5)
    exchange.receive(exchange.connections[0])
    pulls = receive_all(listener, 2)
    assert sorted(m.header.key for m in pulls) == sorted(p.header.key for p in pushes)
    assert all(m.header.command == Command.PULL for m in pulls)
    exchange.close(0)


def test_exchange_of_a_skipped_round_pulls_without_a_push_and_learns_the_rounds_behind(wire):
    listener, make = wire
    exchange = make()
    task = make_task(np.zeros(4, dtype=np.float32), skipped=True, quorum=2, round_=3)
    trip = trip_at(task, Stage.EXCHANGE)
    exchange.exchange(trip)
    (pull,) = receive_all(listener, 1)
    assert pull.header.command == Command.PULL and pull.header.flags & FLAG_SKIPPED and pull.header.round == 3
    listener.send(Command.PULL_RESPONSE, 9, pull.header.key, 3, payload=np.ones(4, np.float32), dtype=0,
                  identity=pull.identity, aux=quorum_aux(2, 5))
    exchange.connections[0].wait_readable(5)
    assert exchange.receive(exchange.connections[0]) == [trip]
    assert (trip.closed_after, task.closed_after) == (5, 5)
    exchange.close(0)


def test_exchange_pulls_bare_what_the_caller_holds(wire):
    listener, make = wire
    exchange = make()
    task = make_task(np.arange(4, dtype=np.float32), skip_pull=((0, 16),), keep_output=((0, 16),))
    trip = trip_at(task, Stage.EXCHANGE)
    exchange.exchange(trip)
    _, push = receive_all(listener, 2)
    assert push.header.flags & FLAG_BARE
    listener.send(Command.PULL_RESPONSE, 9, push.header.key, 0, identity=push.identity)
    exchange.connections[0].wait_readable(5)
    assert exchange.receive(exchange.connections[0]) == [trip]
    assert trip.data is trip.output


def test_a_servers_refusal_becomes_an_event_that_fails_the_keys_tasks(wire):
    listener, make = wire
    exchange = make()
    task = make_task(np.arange(4, dtype=np.float32))
    trip = trip_at(task, Stage.EXCHANGE)
    exchange.exchange(trip)
    _, push = receive_all(listener, 2)
    listener.send(Command.ERROR, 9, push.header.key, 0, payload=b"mismatch for key", identity=push.identity)
    exchange.connections[0].wait_readable(5)
    (event,) = exchange.receive(exchange.connections[0])
    assert isinstance(event, KeyRefused) and event.key == push.header.key and "mismatch" in str(event.error)


@pytest.fixture
def machine():
    """Two local ranks of one machine, in this process, over their real local channel."""
    context = Context()
    job = uuid.uuid4().hex[:8]
    groups = [LocalGroup(context, job, 0, rank, 2, partition_bytes=1 << 20) for rank in range(2)]
    yield groups
    for group in groups:
        group.close()
    context.close()


def deliver(group, timeout_s=5.0):
    assert group.inbox.wait_readable(timeout_s), "no message came"
    return group.receive()


def local_trips(groups, values, **fields):
    """The same task on both ranks; each rank's trip of partition 0 at its first stage."""
    tasks = [make_task(value, **fields) for value in values]
    for task in tasks[1:]:
        task.plan = tasks[0].plan
    root = groups[0].root_of(tasks[0].plan.tensor_id, tasks[0].plan.partitions[0])
    trips = []
    for rank, (group, task) in enumerate(zip(groups, tasks)):
        group.prepare(task)
        route = plan_route(Role.ROOT if rank == root else Role.PEER, False)
        trip = PartitionTrip(task, task.plan.partitions[0], route)
        trip.position = 0
        trips.append(trip)
    return root, tasks, trips


def test_local_reduce_waits_for_every_peer_then_sums_into_its_slot(machine):
    values = [np.arange(6, dtype=np.float32), np.full(6, 10, np.float32)]
    root, tasks, trips = local_trips(machine, values)
    peer = 1 - root
    assert machine[root].local_reduce(trips[root]) is WAIT  # the peer is not ready yet
    assert trips[peer].stage is Stage.COPY_IN
    assert machine[peer].copy_in(trips[peer]) is DONE
    assert deliver(machine[root]) == [trips[root]]
    assert np.array_equal(np.frombuffer(trips[root].data, np.float32), values[0] + values[1])


def test_a_peer_waits_at_local_broadcast_for_the_roots_done(machine):
    values = [np.ones(6, dtype=np.float32), np.ones(6, dtype=np.float32)]
    root, tasks, trips = local_trips(machine, values)
    peer = 1 - root
    machine[peer].copy_in(trips[peer])
    trips[peer].position += 1
    assert machine[peer].local_broadcast(trips[peer]) is WAIT
    machine[root].local_reduce(trips[root])
    deliver(machine[root])
    trips[root].position = trips[root].stages.index(Stage.LOCAL_BROADCAST)
    assert machine[root].local_broadcast(trips[root]) is DONE
    assert deliver(machine[peer]) == [trips[peer]]
    assert np.array_equal(np.frombuffer(trips[peer].data, np.float32), np.full(6, 2, np.float32))


def test_copy_in_of_zeros_copies_nothing_and_says_so(machine):
    values = [np.zeros(6, dtype=np.float32), np.zeros(6, dtype=np.float32)]
    root, tasks, trips = local_trips(machine, values, nonzero=(0, 0))
    peer = 1 - root
    machine[peer].copy_in(trips[peer])
    assert machine[peer].copied_in == 0
    machine[root].local_reduce(trips[root])
    assert deliver(machine[root]) == [trips[root]]
    assert trips[root].zeros  # nobody had bytes there: the servers need only a header


def test_local_ranks_that_disagree_fail_the_round_on_the_root(machine):
    values = [np.ones(6, dtype=np.float32), np.ones(6, dtype=np.float32)]
    root, tasks, trips = local_trips(machine, values)
    peer = 1 - root
    tasks[peer].options = PushPullOptions(average=False)
    tasks[root].options = PushPullOptions(average=True)
    machine[peer].copy_in(trips[peer])
    machine[root].local_reduce(trips[root])
    (event,) = deliver(machine[root])
    assert isinstance(event, Failure) and "averages" in str(event.error) and "sums" in str(event.error)


def test_a_joined_root_stands_in_for_the_rank_still_running(machine):
    values = [np.full(6, 3, np.float32), np.full(6, 3, np.float32)]
    root, tasks, trips = local_trips(machine, values)
    peer = 1 - root
    machine[root].join()  # the root has no more data
    assert deliver(machine[peer]) == []  # LOCAL_JOINED: nothing waits for it yet
    machine[peer].copy_in(trips[peer])
    (stand_in,) = deliver(machine[root])
    trip = stand_in.trip
    assert trip.task.stand_in and trip.stages == (Stage.LOCAL_REDUCE, Stage.LOCAL_BROADCAST)
    trip.position = 0
    assert machine[root].local_reduce(trip) is DONE
    assert np.array_equal(np.frombuffer(trip.data, np.float32), values[peer])  # its own share is zeros
    trip.position = 1
    machine[root].local_broadcast(trip)
    trips[peer].position = trips[peer].stages.index(Stage.LOCAL_BROADCAST)
    machine[peer].local_broadcast(trips[peer])
    assert deliver(machine[peer]) == [trips[peer]]


def test_device_to_host_waits_for_the_copy_then_finishes():
    class Staged:
        ready, waiting = [False], {}

    task = make_task(np.ones(4, np.float32), device=Staged())
    trip = trip_at(task, Stage.DEVICE_TO_HOST, placement=Placement.STAGED)
    stages = DeviceStages()
    assert stages.device_to_host(trip) is WAIT and Staged.waiting == {0: trip}
    (event,) = stages.copies_arrived(DeviceCopyDone(task, (0,)))
    assert event.trip is trip and event.outcome is DONE


def test_copy_out_leaves_what_the_caller_holds():
    task = make_task(np.arange(4, dtype=np.float32), average_over=2, keep_output=((0, 16),))
    trip = trip_at(task, Stage.COPY_OUT)
    trip.data = np.full(16, 7, np.uint8)
    assert CopyOut().copy_out(trip) is DONE
    assert np.array_equal(task.output.array, np.arange(4, dtype=np.float32))
