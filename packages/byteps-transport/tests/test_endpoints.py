"""The endpoint contract, over every transport behind ``tcp://`` on 127.0.0.1.

One suite for all of them, as gloo's tcp/ and ibverbs/ pairs pass the same
tests: ZeroMQ over TCP, the co-located shared-memory path
(``Context(shared_memory=True)``), and RDMA (``Context(rdma=...)``) with the
verbs stand-in for hardware (byteps.testkit.verbs_stand_in: memfds and
copies between processes, no NIC; docs/rdma.md).
"""

import numpy as np
import pytest
import zmq

from byteps.testkit import verbs_stand_in
from byteps.transport import Command, Context, FrameError, RdmaSettings, TransportError, verbs
from byteps.transport.frames import encode_header

TRANSPORTS = ["tcp", "co-located", "rdma"]


@pytest.fixture(params=TRANSPORTS)
def context(request):
    if request.param == "rdma":
        verbs_stand_in.install()
    ctx = Context(shared_memory=request.param == "co-located",
                  rdma=RdmaSettings() if request.param == "rdma" else None)
    ctx.transport = request.param
    yield ctx
    verbs.use_device(None)
    ctx.zmq.destroy(linger=0)  # closes what a failed test left open, so teardown never hangs


@pytest.fixture
def pair(context):
    listener = context.listen("tcp://127.0.0.1:0", max_payload_bytes=1 << 24)
    connection = context.connect(listener.address, max_payload_bytes=1 << 24)
    yield listener, connection
    connection.close(0)
    listener.close(0)


def test_payload_round_trip_and_counters(context, pair):
    """Three round trips: on RDMA the first also connects the queue pairs, the later ones write."""
    listener, connection = pair
    for round_ in range(3):
        data = np.arange(100_000, dtype=np.float32) * (round_ + 1)
        connection.send(Command.PUSH, 3, key=9, round=round_, payload=data, dtype=0)
        message = listener.recv()
        assert message.header.command == Command.PUSH and message.header.sender == 3
        assert message.header.payload_bytes == data.nbytes and message.header.round == round_
        assert np.array_equal(np.frombuffer(message.payload, np.float32), data)
        listener.send(Command.PULL_RESPONSE, 0, key=9, round=round_, payload=data[::-1].copy(),
                      identity=message.identity)
        out = np.zeros_like(data)
        reply = connection.recv(lambda header, out=out: out.view(np.uint8))
        assert reply.payload is None and np.array_equal(out, data[::-1])
        del message
    assert connection.counters.bytes_sent == 3 * (40 + data.nbytes)
    assert connection.counters.bytes_received == 3 * (40 + data.nbytes)
    assert listener.counters.messages_received == 3 and listener.counters.messages_sent == 3
    # which path the payloads took: the co-located ring and RDMA after their first message
    shared = (connection.counters.shared_sent, listener.counters.shared_sent)
    rdma = (connection.counters.rdma_sent, listener.counters.rdma_sent)
    assert shared == {"tcp": (0, 0), "co-located": (3, 3), "rdma": (0, 0)}[context.transport]
    assert rdma == {"tcp": (0, 0), "co-located": (0, 0), "rdma": (2, 2)}[context.transport]


def test_small_and_empty_payloads(pair):
    listener, connection = pair
    for payload in (b"", b"x", bytes(range(256)) * 100):
        connection.send(Command.PUSH, 1, key=2, payload=payload)
        message = listener.recv()
        assert bytes(message.payload) == payload
        listener.send(Command.PUSH_ACK, 0, key=2, payload=payload, identity=message.identity)
        assert bytes(connection.recv().payload) == payload


def test_payload_size_not_matching_header_is_refused(pair, context):
    listener, _ = pair
    raw = context.zmq.socket(zmq.DEALER)
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
    raw = context.zmq.socket(zmq.DEALER)
    raw.connect(listener.address)
    raw.send(encode_header(Command.PUSH, 0, payload_bytes=8))
    with pytest.raises(FrameError, match="missing"):
        listener.recv()
    raw.close(0)


def test_port_in_use_is_reported(context, pair):
    listener, _ = pair
    with pytest.raises(TransportError, match=f"port {listener.port} is in use"):
        context.listen(f"tcp://127.0.0.1:{listener.port}")
