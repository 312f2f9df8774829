"""Transports chosen by address scheme, the poller, and the step-by-step handshake, over real sockets."""

import logging
import os
import time
import uuid

import numpy as np
import pytest

from byteps.transport import (
    AuthenticationError,
    ClientHandshake,
    Command,
    Context,
    Gate,
    Poller,
    TransportError,
    register_transport,
    transport_schemes,
)


@pytest.fixture
def context():
    ctx = Context()
    yield ctx
    ctx.zmq.destroy(linger=0)  # closes what a failed test left open, so teardown never hangs


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:0", "ipc://@byteps-test-" + uuid.uuid4().hex])
def test_listen_and_connect_by_scheme(context, address):
    listener = context.listen(address, max_payload_bytes=1 << 20)
    connection = context.connect(listener.address, max_payload_bytes=1 << 20)
    data = np.arange(1000, dtype=np.int64)
    connection.send(Command.PUSH, 1, key=5, round=2, payload=data)
    assert listener.wait_readable(5)
    message = listener.recv()
    assert (message.header.key, message.header.round) == (5, 2)
    assert np.array_equal(np.frombuffer(message.payload, np.int64), data)
    listener.send(Command.PUSH_ACK, 0, key=5, round=2, identity=message.identity)
    assert connection.wait_readable(5) and connection.recv().header.command == Command.PUSH_ACK
    assert listener.counters.messages_received == connection.counters.messages_received == 1


def test_unknown_scheme_names_the_known_ones(context):
    with pytest.raises(TransportError, match=r"no transport for address 'rdma://10.0.0.1:5'.*ipc, tcp"):
        context.connect("rdma://10.0.0.1:5")


def test_a_registered_transport_serves_its_scheme(context):
    made = []

    def factory(ctx, address, limit):
        made.append((address, limit))
        return context.listen("tcp://127.0.0.1:0", limit)

    register_transport("fake", factory, factory)
    assert "fake" in transport_schemes()
    endpoint = context.listen("fake://anything", 64)
    endpoint.close(0)
    assert made == [("fake://anything", 64)]


def test_poller_returns_the_registered_endpoints_and_descriptors(context):
    first = context.listen("tcp://127.0.0.1:0")
    second = context.listen("tcp://127.0.0.1:0")
    client = context.connect(second.address)
    read_fd, write_fd = os.pipe()
    try:
        poller = Poller()
        for item in (first, second, read_fd):
            poller.register(item)
        assert poller.poll(0.05) == []
        client.send(Command.HEARTBEAT, 0)
        os.write(write_fd, b"x")
        deadline = time.monotonic() + 5
        ready = poller.poll(1.0)
        while not any(item is second for item in ready) and time.monotonic() < deadline:
            ready = poller.poll(0.1)
        assert len(ready) == 2 and any(item is second for item in ready) and read_fd in ready
        poller.unregister(read_fd)
        os.read(read_fd, 1)
        second.recv()
        assert poller.poll(0.05) == []
    finally:
        os.close(read_fd)
        os.close(write_fd)


def _serve(listener, gate, rounds=1):
    for _ in range(rounds):
        assert listener.wait_readable(5)
        message = listener.recv()
        gate.admit(listener, message)


def test_step_by_step_handshake_admits_the_secret_and_refuses_a_wrong_one(context):
    listener = context.listen("tcp://127.0.0.1:0")
    gate = Gate(b"secret", 0, logging.getLogger("test"))
    good = context.connect(listener.address)
    handshake = ClientHandshake(good, b"secret", 3)
    handshake.start()
    _serve(listener, gate)  # HELLO -> CHALLENGE
    assert good.wait_readable(5) and handshake.step(good.recv()) is False  # CHALLENGE -> PROOF
    _serve(listener, gate)  # PROOF -> AUTH_OK
    assert good.wait_readable(5) and handshake.step(good.recv()) is True and handshake.done
    good.send(Command.PUSH, 3, key=1, payload=b"abcd")
    assert listener.wait_readable(5)
    assert gate.admit(listener, listener.recv())

    wrong = context.connect(listener.address)
    impostor = ClientHandshake(wrong, b"guess", 4)
    impostor.start()
    _serve(listener, gate)
    assert wrong.wait_readable(5)
    with pytest.raises(AuthenticationError, match="BYTEPS_JOB_SECRET differs"):
        impostor.step(wrong.recv())
