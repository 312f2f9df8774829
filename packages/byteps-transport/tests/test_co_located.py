"""The co-located fast path: payloads through shared memory between endpoints of one host, on 127.0.0.1."""

import gc
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import zmq

from byteps.transport import Command, Context, FrameError
from byteps.transport.co_located import (
    MIN_SHARED_BYTES,
    PAGE_BYTES,
    REFERENCE,
    RING_BYTES,
    RING_PAGES,
    SharedConnection,
    SharedListener,
    is_local_address,
)
from byteps.transport.frames import encode_header


@pytest.fixture
def shared():
    context = Context(shared_memory=True)
    listener = context.listen("tcp://127.0.0.1:0", max_payload_bytes=1 << 26)
    connection = context.connect(listener.address, max_payload_bytes=1 << 26)
    yield listener, connection
    connection.close(0)
    listener.close(0)
    context.zmq.destroy(linger=0)


def push(connection, listener, data, key=1):
    connection.send(Command.PUSH, 3, key=key, payload=data)
    assert listener.wait_readable(5)
    return listener.recv()


def test_tcp_endpoints_to_this_host_take_the_shared_path_both_ways(shared):
    listener, connection = shared
    assert isinstance(listener, SharedListener) and isinstance(connection, SharedConnection)
    data = np.arange(300_000, dtype=np.float32)
    message = push(connection, listener, data)
    assert message.header.payload_bytes == data.nbytes
    assert np.array_equal(np.frombuffer(message.payload, np.float32), data)
    assert connection.counters.shared_sent == 1 and listener.counters.shared_received == 1
    # The peer sent through its ring, so it shares the host: the answer goes through the listener's ring,
    # straight into the caller's buffer.
    listener.send(Command.PULL_RESPONSE, 0, key=1, payload=data[::-1].copy(), identity=message.identity)
    out = np.zeros_like(data)
    assert connection.wait_readable(5)
    reply = connection.recv(lambda header: out)
    assert reply.payload is None and np.array_equal(out, data[::-1])
    assert listener.counters.shared_sent == 1 and connection.counters.shared_received == 1
    assert listener._rings[message.identity].pages_in_use() == 0  # copied out: freed at once
    # The byte counters are those of the message, wherever its payload went.
    assert connection.counters.bytes_sent == 40 + data.nbytes == connection.counters.bytes_received


def test_small_payloads_and_a_context_without_shared_memory_go_inline():
    context = Context(shared_memory=False)
    listener = context.listen("tcp://127.0.0.1:0")
    connection = context.connect(listener.address)
    try:
        data = np.ones(MIN_SHARED_BYTES, np.uint8)
        message = push(connection, listener, data)
        assert np.array_equal(np.frombuffer(message.payload, np.uint8), data)
        assert connection.counters.shared_sent == 0 and listener.counters.shared_received == 0
    finally:
        connection.close(0)
        listener.close(0)
        context.zmq.destroy(linger=0)


def test_a_payload_below_the_threshold_goes_inline(shared):
    listener, connection = shared
    message = push(connection, listener, np.ones(MIN_SHARED_BYTES - 1, np.uint8))
    assert message.header.payload_bytes == MIN_SHARED_BYTES - 1
    assert connection.counters.shared_sent == 0


def test_pages_are_freed_when_the_last_view_goes_and_a_full_ring_falls_back_to_tcp(shared):
    listener, connection = shared
    block = PAGE_BYTES * 8
    held = []
    for i in range(RING_PAGES // 8 + 3):  # 3 more than the ring holds while every view is kept
        data = np.full(block, i % 251, np.uint8)
        message = push(connection, listener, data, key=i)
        # a derived view (numpy) alone keeps the pages too
        held.append(np.frombuffer(message.payload, np.uint8)[10:])
        del message
    assert connection.counters.shared_sent == RING_PAGES // 8  # the last 3 went inline
    assert connection._ring.pages_in_use() == RING_PAGES
    for i, view in enumerate(held):
        assert view[0] == i % 251 and view[-1] == i % 251
    held.clear()
    gc.collect()
    assert connection._ring.pages_in_use() == 0
    message = push(connection, listener, np.full(block, 7, np.uint8))
    assert connection.counters.shared_sent == RING_PAGES // 8 + 1 and bytes(message.payload[:3]) == b"\7\7\7"


def test_only_addresses_of_this_host_are_local():
    assert is_local_address("127.0.0.1") and is_local_address("127.0.0.9")
    assert not is_local_address("192.0.2.1")  # TEST-NET-1: never assigned to a host
    context = Context(shared_memory=True)
    try:
        far = context.connect("tcp://192.0.2.1:9")
        assert not far.sends_shared
        far.close(0)
    finally:
        context.zmq.destroy(linger=0)


def test_a_reference_that_cannot_be_mapped_is_refused_and_the_listener_carries_on(shared):
    listener, connection = shared
    raw = listener.socket.context.socket(zmq.DEALER)
    raw.connect(listener.address)
    try:
        header = encode_header(Command.PUSH, 0, key=4, payload_bytes=PAGE_BYTES)
        forged = REFERENCE.pack(1, 1, 99999, 1 << 40, 4096, PAGE_BYTES)  # pid 1's fd 99999, a wrong size
        raw.send_multipart([header, b"", forged])
        assert listener.wait_readable(5)
        with pytest.raises(FrameError, match="ring of"):
            listener.recv()
        forged = REFERENCE.pack(1, 1, 99999, RING_BYTES, 8192, PAGE_BYTES)
        raw.send_multipart([header, b"", forged])
        assert listener.wait_readable(5)
        with pytest.raises(FrameError, match="BYTEPS_ENABLE_IPC=0"):
            listener.recv()
        raw.send_multipart([header, b"", b"short"])
        assert listener.wait_readable(5)
        with pytest.raises(FrameError, match="reference of 5 bytes"):
            listener.recv()
        # A real peer's reference outside its ring
        push(connection, listener, np.ones(MIN_SHARED_BYTES, np.uint8))  # the listener maps the ring
        ring = connection._ring
        outside = REFERENCE.pack(ring.ring_id, ring.pid, ring.fd, RING_BYTES, 4096 + 1, PAGE_BYTES)
        raw.send_multipart([header, b"", outside])
        assert listener.wait_readable(5)
        with pytest.raises(FrameError, match="outside its ring"):
            listener.recv()
        # the stream stays in sync: the good peer is still served
        message = push(connection, listener, np.full(MIN_SHARED_BYTES, 5, np.uint8))
        assert bytes(message.payload[:2]) == b"\5\5"
    finally:
        raw.close(0)


PEER = textwrap.dedent("""
    import sys
    import numpy as np
    from byteps.transport import Command, Context
    context = Context(shared_memory=True)
    connection = context.connect(sys.argv[1], max_payload_bytes=1 << 26)
    for i in range(20):
        connection.send(Command.PUSH, 1, key=i, payload=np.full(250_000, i, np.float32))
    out = np.zeros(250_000, np.float32)
    for i in range(20):
        assert connection.wait_readable(10)
        connection.recv(lambda header: out)
        assert (out == 2 * i).all(), (i, out[:3])
    print("OK", connection.counters.shared_sent, connection.counters.shared_received, flush=True)
    connection.close(0)
    context.close()
""")


def test_another_process_pushes_and_pulls_through_shared_memory(shared):
    listener, _ = shared
    peer = subprocess.Popen([sys.executable, "-c", PEER, listener.address], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        for i in range(20):
            assert listener.wait_readable(20), peer.stderr.read() if peer.poll() is not None else "no push"
            message = listener.recv()
            pushed = np.frombuffer(message.payload, np.float32)
            assert message.header.key == i and (pushed == i).all()
            listener.send(Command.PULL_RESPONSE, 0, key=i, payload=pushed * 2, identity=message.identity)
        out, err = peer.communicate(timeout=20)
        assert peer.returncode == 0, err
        assert out.split() == ["OK", "20", "20"]
        assert listener.counters.shared_received == 20 and listener.counters.shared_sent == 20
    finally:
        if peer.poll() is None:
            peer.kill()
            peer.wait()
