"""Scheduler rendezvous with real sockets: nodes in threads, the scheduler in a thread."""

import logging
import threading
import time

import pytest
import zmq

from byteps.transport import (
    _C,
    ClockEstimate,
    Command,
    NodeInfo,
    RemoteError,
    RendezvousTimeout,
    Scheduler,
    SchedulerClient,
    SchedulerOptions,
)
from byteps.transport.frames import PROTOCOL_VERSION, decode_header
from byteps.transport.job_log import JOB_LOGGER
from byteps.transport.rendezvous import BARRIER_ASK_ARRIVAL, BARRIER_WORKERS


@pytest.fixture
def context():
    """A context whose sockets are all closed at teardown, even when a test failed half-way."""
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
def scheduler_factory():
    started = []

    def start(machines, servers):
        scheduler = Scheduler(SchedulerOptions("127.0.0.1", 0, machines, servers), zmq.Context())
        thread = threading.Thread(target=scheduler.run, daemon=True)
        thread.start()
        started.append((scheduler, thread))
        return scheduler

    yield start
    for scheduler, thread in started:
        thread.join(timeout=10)
        scheduler.stop()  # a failed test may have left it waiting for nodes
        thread.join(timeout=5)
        assert not thread.is_alive(), "a scheduler thread did not stop"
        scheduler.context.destroy(linger=0)


def run_nodes(port, infos, after_register=None):
    """Register each NodeInfo from its own thread; returns address books by position."""
    books, errors = [None] * len(infos), []

    def node(i, info):
        context = zmq.Context()
        client = SchedulerClient(context, "127.0.0.1", port, timeout_s=20)
        try:
            books[i] = client.register(info)
            if after_register:
                after_register(client, info)
        except Exception as exc:  # reported to the test below
            errors.append(exc)
        finally:
            client.close()
            context.term()

    threads = [threading.Thread(target=node, args=(i, info)) for i, info in enumerate(infos)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return books, errors


def finish(client, info):
    if info.role == "worker":
        client.barrier()
        client.finalize()
    else:
        message = client.recv()
        while message.header.command == Command.HEARTBEAT:  # the answer to a heartbeat the test sent
            message = client.recv()
        assert message.header.command == Command.TERMINATE


def test_two_machines_of_two_and_two_servers(scheduler_factory):
    scheduler = scheduler_factory(2, 2)
    infos = [NodeInfo("server", "127.0.0.1", 7001), NodeInfo("server", "127.0.0.1", 7000)]
    infos += [NodeInfo("worker", worker_id=w, local_rank=lr, local_size=2) for w in (1, 0) for lr in (1, 0)]
    books, errors = run_nodes(scheduler.listener.port, infos, finish)
    assert errors == []
    servers = (("127.0.0.1", 7000), ("127.0.0.1", 7001))
    assert all(book.servers == servers and book.num_workers == 4 for book in books)
    assert [b.rank for b in books[:2]] == [1, 0]  # servers ranked by address
    assert [b.rank for b in books[2:]] == [3, 2, 1, 0]  # rank = worker_id * local_size + local_rank


def test_a_barrier_that_asks_hears_its_arrival_counted_before_the_release(scheduler_factory):
    """hvd.join()'s order: rank 1 enters only after rank 0 heard BARRIER_ARRIVED; the release names rank 1."""
    scheduler = scheduler_factory(2, 0)
    heard = {0: [], 1: []}
    first_counted = threading.Event()

    def join(client, info):
        rank = info.worker_id
        if rank == 1:
            assert first_counted.wait(20), "rank 0 never heard its arrival counted"
        client.connection.send(Command.BARRIER, client.rank, round=BARRIER_ASK_ARRIVAL, aux=BARRIER_WORKERS)
        while True:
            message = client.recv()
            if message.header.command == Command.HEARTBEAT:
                continue
            heard[rank].append((Command(message.header.command).name, message.header.key))
            if message.header.command == Command.BARRIER_ARRIVED and rank == 0:
                first_counted.set()
            if message.header.command == Command.BARRIER_RELEASE:
                break
        client.finalize()

    infos = [NodeInfo("worker", worker_id=w, local_rank=0, local_size=1) for w in (0, 1)]
    books, errors = run_nodes(scheduler.listener.port, infos, join)
    assert errors == []
    assert heard[0] == [("BARRIER_ARRIVED", 0), ("BARRIER_RELEASE", 1)]
    assert heard[1] == [("BARRIER_ARRIVED", 0), ("BARRIER_RELEASE", 1)]


def test_duplicate_rank_is_refused_with_both_nodes_named(scheduler_factory, context):
    scheduler = scheduler_factory(1, 1)
    first = SchedulerClient(context, "127.0.0.1", scheduler.listener.port, timeout_s=5)
    first.connection.send(Command.REGISTER, -1, payload=b'{"role":"worker","pid":1}')
    deadline = time.monotonic() + 10
    while 0 not in scheduler.workers:  # the first must have its rank before the second asks
        assert time.monotonic() < deadline, "the first registration never arrived"
        time.sleep(0.01)
    second = SchedulerClient(context, "127.0.0.1", scheduler.listener.port, timeout_s=5)
    with pytest.raises(RemoteError, match=r"duplicates rank 0 already taken by worker 0 local rank 0 \(pid 1\)"):
        second.register(NodeInfo("worker", pid=2))
    books, errors = run_nodes(scheduler.listener.port, [NodeInfo("server", "127.0.0.1", 7000)],
                              lambda c, i: None)
    assert errors == [] and books[0].num_workers == 1
    assert first.connection.recv().header.command == Command.ADDRESS_BOOK
    first.rank = 0
    first.finalize()


def test_bad_worker_id_and_unknown_role_are_refused(scheduler_factory, context):
    scheduler = scheduler_factory(2, 1)
    client = SchedulerClient(context, "127.0.0.1", scheduler.listener.port, timeout_s=5)
    with pytest.raises(RemoteError, match="DMLC_WORKER_ID=5 is outside 0..1"):
        client.register(NodeInfo("worker", worker_id=5))
    with pytest.raises(RemoteError, match="unknown role 'gardener'"):
        client.register(NodeInfo("gardener"))
    client.connection.send(Command.REGISTER, -1, payload=b"{not json")
    with pytest.raises(RemoteError, match="malformed control payload"):
        client.recv()
    books, errors = run_nodes(scheduler.listener.port, [NodeInfo("server", "127.0.0.1", 1)] +
                              [NodeInfo("worker", worker_id=w) for w in (0, 1)], finish)
    assert errors == []


def test_peer_of_other_protocol_version_is_refused_clearly(scheduler_factory, context):
    scheduler = scheduler_factory(1, 1)
    raw = context.socket(zmq.DEALER)
    raw.connect(scheduler.address)
    raw.send_multipart([_C.encode(int(Command.REGISTER), -1, 0, 0, 0, version=PROTOCOL_VERSION + 1)])
    assert raw.poll(5000)
    header_frame, text = raw.recv_multipart()
    header = decode_header(header_frame, 1 << 20)
    assert header.command == Command.ERROR
    assert f"peer speaks byteps wire protocol v{PROTOCOL_VERSION + 1}" in text.decode()
    assert f"this process speaks v{PROTOCOL_VERSION}" in text.decode()
    books, errors = run_nodes(scheduler.listener.port,
                              [NodeInfo("server", "127.0.0.1", 1), NodeInfo("worker")], finish)
    assert errors == []  # the scheduler carried on


def test_unreachable_scheduler_times_out_naming_the_address(context):
    client = SchedulerClient(context, "127.0.0.1", 1, timeout_s=0.5)
    with pytest.raises(RendezvousTimeout, match=r"scheduler at tcp://127.0.0.1:1 within 0.5 s .*"
                                                 r"DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT"):
        client.register(NodeInfo("worker"))


def test_a_node_waiting_for_an_absent_scheduler_says_so_within_5_s(context, caplog):
    client = SchedulerClient(context, "127.0.0.1", 1, timeout_s=6.5)
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger=JOB_LOGGER), pytest.raises(RendezvousTimeout):
        client.register(NodeInfo("worker", worker_id=3))
    waits = [r for r in caplog.records if r.name == JOB_LOGGER]
    assert len(waits) == 1, [r.getMessage() for r in waits]
    assert waits[0].created - (time.time() - (time.monotonic() - started)) <= 5.5
    text = waits[0].getMessage()
    assert "worker 3 waits for the scheduler at tcp://127.0.0.1:1: no answer for 5 s" in text
    assert "DMLC_PS_ROOT_URI/DMLC_PS_ROOT_PORT" in text and "giving up after 6.5 s" in text


def test_waiting_nodes_learn_from_the_scheduler_which_ranks_are_missing(scheduler_factory, caplog):
    with caplog.at_level(logging.INFO, logger=JOB_LOGGER):
        scheduler = scheduler_factory(2, 1)
        port = scheduler.listener.port
        early = []
        first = threading.Thread(target=lambda: early.append(run_nodes(
            port, [NodeInfo("server", "127.0.0.1", 1), NodeInfo("worker", worker_id=0)], finish)))
        first.start()
        deadline = time.monotonic() + 15

        def said(start):
            return any(r.getMessage().startswith(start) for r in caplog.records)

        # both the scheduler's own line and a node's repeat: they come about together, in either order
        while not (said("scheduler still waits for worker rank 1") and said("server registered; the scheduler")):
            assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
            time.sleep(0.1)
        books, errors = run_nodes(port, [NodeInfo("worker", worker_id=1)], finish)
        first.join(timeout=20)
    assert errors == [] and books[0].rank == 1
    assert early and early[0][1] == [] and early[0][0][1].rank == 0
    lines = [r.getMessage() for r in caplog.records if r.name == JOB_LOGGER]
    assert any(line.startswith("scheduler up on tcp://127.0.0.1:") and "1 server and 2 worker machines" in line
               for line in lines)
    # The scheduler says it itself, and each registered node repeats its answer.
    assert any(line.startswith("scheduler still waits for worker rank 1 (1/2 worker processes registered)")
               for line in lines)
    assert any(line.startswith("server registered; the scheduler still waits for worker rank 1") for line in lines)
    assert any(line.startswith("all nodes registered in ") and "1 server, 2 worker processes on 2 machines" in line
               for line in lines)


def test_the_clock_estimate_keeps_the_shortest_round_trip():
    clock = ClockEstimate()
    assert clock.offset_s is None
    clock.add(sent=100.0, scheduler=105.5, received=101.0)  # offset 5.0 within 0.5
    assert (clock.offset_s, clock.error_s) == (5.0, 0.5)
    clock.add(sent=200.0, scheduler=207.0, received=204.0)  # a slower trip: ignored
    assert (clock.offset_s, clock.error_s) == (5.0, 0.5)
    clock.add(sent=300.0, scheduler=305.2, received=300.2)  # faster: kept
    assert clock.offset_s == pytest.approx(5.1) and clock.error_s == pytest.approx(0.1)


def test_nodes_learn_their_clock_offset_from_heartbeats(scheduler_factory):
    scheduler = scheduler_factory(1, 1)

    def beat(client, info):
        deadline = time.monotonic() + 30  # generous: a loaded 2-core machine answers late, not never
        while client.clock.offset_s is None:  # a heartbeat, then its answer
            assert time.monotonic() < deadline, "no clock estimate from the heartbeats"
            client.pulse()
            if client.connection.wait_readable(0.1):
                client.recv()
        assert abs(client.clock.offset_s) < 0.05 and client.clock.error_s < 0.05  # one machine, one clock
        finish(client, info)

    books, errors = run_nodes(scheduler.listener.port, [NodeInfo("server", "127.0.0.1", 1), NodeInfo("worker")],
                              beat)
    assert errors == []


def test_a_node_with_other_job_settings_fails_every_node_and_the_scheduler(context):
    scheduler = Scheduler(SchedulerOptions("127.0.0.1", 0, 2, 1), context)
    ended = []

    def run():
        try:
            scheduler.run()
        except Exception as exc:  # the scheduler's exit, checked below
            ended.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        first = SchedulerClient(context, "127.0.0.1", scheduler.listener.port, timeout_s=10)
        first.connection.send(Command.REGISTER, -1,
                              payload=b'{"role":"server","host":"127.0.0.1","port":7000,"pid":1,'
                                      b'"settings":{"BYTEPS_ENABLE_ASYNC":"1"}}')
        deadline = time.monotonic() + 10
        while not scheduler.servers:
            assert time.monotonic() < deadline, "the first registration never arrived"
            time.sleep(0.01)
        second = SchedulerClient(context, "127.0.0.1", scheduler.listener.port, timeout_s=5)
        with pytest.raises(RemoteError, match=r"worker 0 local rank 0 \(pid 2\) has BYTEPS_ENABLE_ASYNC='0' but "
                                              r"server at 127.0.0.1:7000 \(pid 1\) has BYTEPS_ENABLE_ASYNC='1'"):
            second.register(NodeInfo("worker", pid=2, settings={"BYTEPS_ENABLE_ASYNC": "0"}))
        # The node already registered is told too, and the scheduler ends instead of waiting for the rest.
        with pytest.raises(RemoteError, match="BYTEPS_ENABLE_ASYNC"):
            first.recv()
        thread.join(timeout=10)
        assert not thread.is_alive() and "BYTEPS_ENABLE_ASYNC" in str(ended[0])
    finally:
        scheduler.stop()
        thread.join(timeout=5)
