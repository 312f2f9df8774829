"""Endpoints over real TCP sockets on 127.0.0.1."""

import numpy as np
import pytest
import zmq

from byteps.transport import Command, Connection, FrameError, Listener, TransportError
from byteps.transport.frames import encode_header


@pytest.fixture
def context():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)  # closes what a failed test left open, so teardown never hangs


@pytest.fixture
def pair(context):
    listener = Listener(context, "127.0.0.1", 0, max_payload_bytes=1 << 24)
    connection = Connection(context, "127.0.0.1", listener.port, max_payload_bytes=1 << 24)
    yield listener, connection
    connection.close(0)
    listener.close(0)


def test_payload_round_trip_and_counters(pair):
    listener, connection = pair
    data = np.arange(100_000, dtype=np.float32)
    connection.send(Command.PUSH, 3, key=9, round=1, payload=data, dtype=0)
    message = listener.recv()
    assert message.header.command == Command.PUSH and message.header.sender == 3
    assert message.header.payload_bytes == data.nbytes
    assert np.array_equal(np.frombuffer(message.payload, np.float32), data)
    listener.send(Command.PULL_RESPONSE, 0, key=9, round=1, payload=data[::-1].copy(), identity=message.identity)
    out = np.zeros_like(data)
    reply = connection.recv(lambda header: out.view(np.uint8))
    assert reply.payload is None and np.array_equal(out, data[::-1])
    assert connection.counters.bytes_sent == 40 + data.nbytes
    assert connection.counters.bytes_received == 40 + data.nbytes
    assert listener.counters.messages_received == 1 and listener.counters.messages_sent == 1


def test_payload_size_not_matching_header_is_refused(pair, context):
    listener, _ = pair
    raw = context.socket(zmq.DEALER)
    raw.connect(listener.address)
    raw.send_multipart([encode_header(Command.PUSH, 0, payload_bytes=8), b"only4"])
    with pytest.raises(FrameError, match="payload is 5 bytes, header announced 8") as info:
        listener.recv()
    assert info.value.identity is not None  # the listener can answer the bad peer
    raw.send_multipart([encode_header(Command.PUSH, 0, payload_bytes=2), b"ab", b"extra"])
    with pytest.raises(FrameError, match="more than one payload"):
        listener.recv()
    # the stream stays in sync after bad messages
    raw.send_multipart([encode_header(Command.PULL, 0, key=1)])
    assert listener.recv().header.key == 1
    raw.close(0)


def test_missing_payload_is_refused(pair, context):
    listener, _ = pair
    raw = context.socket(zmq.DEALER)
    raw.connect(listener.address)
    raw.send(encode_header(Command.PUSH, 0, payload_bytes=8))
    with pytest.raises(FrameError, match="missing"):
        listener.recv()
    raw.close(0)


def test_port_in_use_is_reported(context, pair):
    listener, _ = pair
    with pytest.raises(TransportError, match=f"port {listener.port} is in use"):
        Listener(context, "127.0.0.1", listener.port)
