"""The endpoint contract, over every transport behind ``tcp://`` on 127.0.0.1.

One suite for all of them, as gloo's tcp/ and ibverbs/ pairs pass the same
tests: ZeroMQ over TCP, the co-located shared-memory path
(``Context(shared_memory=True)``), and RDMA (``Context(rdma=...)``) with the
verbs stand-in for hardware (byteps.testkit.verbs_stand_in: memfds and
copies between processes, no NIC; docs/rdma.md).
"""

import collections

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


#: payload sizes around every boundary (RDMA's and the co-located path's 16 KiB threshold and pages) up to 16 MB
SIZES = [1, 1000, (16 << 10) - 1, 16 << 10, (16 << 10) + 1, 1 << 20, (4 << 20) + 3, 16 << 20]
RING_BYTES = 2048 * (16 << 10)  # the RDMA and co-located rings: 32 MiB


def test_payloads_from_one_byte_to_16_mb_wrap_the_ring_several_times(context, pair):
    """Each size both ways. The listener holds the last messages, as many as fill the ring but one, so that
    pages are taken all around it; sizes of 1 MB and more run until the ring was gone round three times."""
    listener, connection = pair
    listener.max_payload_bytes = connection.max_payload_bytes = 1 << 25
    rng = np.random.default_rng(1)
    large = 0
    for size in SIZES:
        pages = -(-size // (16 << 10))
        window = RING_BYTES // (16 << 10) // pages - 1 if size >= 1 << 20 else 1
        rounds = 3 * (window + 1) if size >= 1 << 20 else 4
        data = rng.integers(0, 256, size, dtype=np.uint8)
        held = collections.deque(maxlen=window)
        for round_ in range(rounds):
            data[0] = round_ % 256
            connection.send(Command.PUSH, 1, key=size, round=round_, payload=data)
            message = listener.recv()
            assert message.header.payload_bytes == size and np.array_equal(np.frombuffer(message.payload, np.uint8),
                                                                           data)
            listener.send(Command.PULL_RESPONSE, 0, key=size, payload=message.payload, identity=message.identity)
            back = np.empty_like(data)
            connection.recv(lambda header, back=back: back.view(np.uint8))
            assert np.array_equal(back, data)
            held.append(message)  # the oldest held message goes: its pages are the next free ones
            large += size >= 16 << 10
        held.clear()
        del message
    if context.transport == "rdma":  # every large payload after the first (the handshake's) written, both ways
        assert connection.counters.rdma_sent == large - 1 and listener.counters.rdma_sent == large - 1
        assert connection.peer.pages_in_use() == 0
        assert all(peer.pages_in_use() == 0 for peer in listener.peers.values())
