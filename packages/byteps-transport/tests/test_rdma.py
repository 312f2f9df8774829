"""The RDMA transport's bookkeeping, with the verbs stand-in for hardware; and the real loopback where it runs.

The stand-in (byteps.testkit.verbs_stand_in) registers memory as memfds and
"writes" by copying into the peer process's memfd: the handshake, page
tables, references, freeing and failures run as they do on a NIC, without
one (docs/rdma.md). The last test runs RDMA for real, wherever pyverbs
lists a device (soft-RoCE included), and skips here with the reason.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import zmq

from byteps.testkit import verbs_stand_in
from byteps.transport import (
    Command,
    Context,
    FrameError,
    NodeFailure,
    RdmaSettings,
    RdmaUnavailable,
    verbs,
)
from byteps.transport.frames import encode_header
from byteps.transport.rdma_endpoints import MIN_RDMA_BYTES, PAGE_BYTES, REFERENCE, RING_PAGES

CHILD = textwrap.dedent("""
    import sys, numpy as np
    from byteps.testkit import verbs_stand_in
    from byteps.transport import Command, Context, RdmaSettings
    verbs_stand_in.install()
    context = Context(rdma=RdmaSettings())
    listener = context.listen("tcp://127.0.0.1:0", max_payload_bytes=1 << 24)
    print(listener.address, flush=True)
    while True:  # echo every payload, doubled
        message = listener.recv()
        if message.header.command == Command.BARRIER:
            break
        doubled = np.frombuffer(message.payload, np.float32) * 2
        identity, key = message.identity, message.header.key
        del message  # its ring pages are free again
        listener.send(Command.PULL_RESPONSE, 0, key=key, payload=doubled, identity=identity)
    listener.close(0)
""")


@pytest.fixture
def context():
    made = verbs_stand_in.install()
    made.clear()
    ctx = Context(rdma=RdmaSettings())
    yield ctx
    verbs.use_device(None)
    ctx.zmq.destroy(linger=0)


@pytest.fixture
def pair(context):
    listener = context.listen("tcp://127.0.0.1:0", max_payload_bytes=1 << 26)
    connection = context.connect(listener.address, max_payload_bytes=1 << 26)
    yield listener, connection
    connection.close(0)
    listener.close(0)


def connect(listener, connection):
    """One large round trip: HELLO, WELCOME, and the connection's first reference."""
    payload = np.ones(MIN_RDMA_BYTES // 4, np.float32)
    for _ in range(2):
        connection.send(Command.PUSH, 1, payload=payload)
        message = listener.recv()
        listener.send(Command.PUSH_ACK, 0, identity=message.identity)
        connection.recv()
    assert connection.peer.connected and connection.counters.rdma_sent == 1
    return message.identity


def echo_rounds(connection, rounds, count):
    """Send ``rounds`` payloads to the echo child (CHILD); each comes back doubled."""
    for round_ in range(rounds):
        data = np.arange(count, dtype=np.float32) + round_
        connection.send(Command.PUSH, 1, key=round_, payload=data)
        assert connection.wait_readable(10)
        out = np.empty_like(data)
        connection.recv(lambda header, out=out: out.view(np.uint8))
        assert np.array_equal(out, data * 2)


def test_queue_pairs_connect_on_the_traffic_and_payloads_go_by_write(pair):
    listener, connection = pair
    small = np.arange(100, dtype=np.float32)  # below MIN_RDMA_BYTES: always inline, no handshake
    connection.send(Command.PUSH, 1, payload=small)
    assert np.array_equal(np.frombuffer(listener.recv().payload, np.float32), small)
    assert connection.peer is None
    identity = connect(listener, connection)
    device = verbs_stand_in.made[0]
    written = device.bytes_written
    big = np.random.default_rng(0).random(300_000).astype(np.float32)
    connection.send(Command.PUSH, 1, key=5, payload=big)
    message = listener.recv()
    assert np.array_equal(np.frombuffer(message.payload, np.float32), big)
    assert device.bytes_written == written + big.nbytes and listener.counters.rdma_received == 2
    # the listener answers by write too, now that the peer has written to it
    listener.send(Command.PULL_RESPONSE, 0, key=5, payload=big[::-1].copy(), identity=identity)
    out = np.empty_like(big)
    connection.recv(lambda header: out.view(np.uint8))
    assert np.array_equal(out, big[::-1]) and listener.counters.rdma_sent == 1


def test_pages_are_freed_when_the_last_view_goes(pair):
    listener, connection = pair
    connect(listener, connection)
    payload = np.ones(10 * PAGE_BYTES // 4, np.float32)
    connection.send(Command.PUSH, 1, payload=payload)
    message = listener.recv()
    view = np.frombuffer(message.payload, np.float32)[5:]
    assert connection.peer.pages_in_use() == 10
    del message
    assert connection.peer.pages_in_use() == 10  # a numpy view still holds them
    del view
    assert connection.peer.pages_in_use() == 0  # the listener wrote zeros into the connection's table


def test_a_full_ring_falls_back_to_tcp_with_the_bytes_intact(pair):
    listener, connection = pair
    connect(listener, connection)
    chunk = RING_PAGES * PAGE_BYTES // 4  # a quarter of the ring
    held = []
    for index in range(6):
        data = np.full(chunk // 4, index, np.float32)
        connection.send(Command.PUSH, 1, key=index, payload=data)
        held.append(listener.recv())
    assert connection.counters.rdma_sent == 1 + 4  # the ring holds four; the last two went inline
    for index, message in enumerate(held):
        assert np.all(np.frombuffer(message.payload, np.float32) == index)
    held.clear()
    connection.send(Command.PUSH, 1, payload=np.ones(chunk // 4, np.float32))
    listener.recv()
    assert connection.counters.rdma_sent == 6  # room again


def test_bad_references_are_refused_and_the_good_peer_is_still_served(pair, context):
    listener, connection = pair
    raw = context.zmq.socket(zmq.DEALER)
    raw.connect(listener.address)
    reference = REFERENCE.pack(b"BPSRDMA1", 0, 64)
    raw.send_multipart([encode_header(Command.PUSH, 9, payload_bytes=64), b"", reference])
    with pytest.raises(FrameError, match="a peer that sent no HELLO"):
        listener.recv()
    identity = connect(listener, connection)
    for bad, text in [(REFERENCE.pack(b"BPSRDMA1", 3, 64), "outside its ring"),
                      (REFERENCE.pack(b"BPSRDMA1", 0, RING_PAGES * PAGE_BYTES + 1), "outside its ring"),
                      (b"short", "RDMA reference of 5 bytes")]:
        connection.socket.send_multipart([encode_header(Command.PUSH, 1, payload_bytes=64), b"", bad])
        with pytest.raises(FrameError, match=text):
            listener.recv()
    connection.send(Command.PUSH, 1, payload=np.ones(MIN_RDMA_BYTES, np.uint8))
    assert listener.recv().identity == identity
    raw.close(0)


def test_a_handshake_nobody_asked_for_is_refused(pair):
    listener, connection = pair
    connection.socket.send_multipart([encode_header(Command.PUSH, 1), b"", b"BPSRDMAW{}"])
    with pytest.raises(FrameError, match="a WELCOME sent to a listener"):
        listener.recv()
    connection.socket.send_multipart([encode_header(Command.PUSH, 1), b"", b"BPSRDMAH{not json"])
    with pytest.raises(FrameError, match="malformed RDMA handshake"):
        listener.recv()


def test_bytes_move_between_processes_and_a_dead_peer_is_a_node_failure(context):
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        address = child.stdout.readline().strip()
        connection = context.connect(address, max_payload_bytes=1 << 24)
        echo_rounds(connection, 3, 50_000)
        assert connection.counters.rdma_sent == 2 and connection.counters.rdma_received == 2
        child.kill()
        child.wait(10)
        with pytest.raises(NodeFailure, match="the peer is gone"):
            connection.send(Command.PUSH, 1, payload=np.ones(50_000, np.float32))
        connection.close(0)
    finally:
        child.kill()
        child.wait(10)


def test_without_pyverbs_the_error_names_the_package(monkeypatch):
    verbs.use_device(None)
    monkeypatch.setitem(sys.modules, "pyverbs", None)  # import pyverbs raises ImportError
    for name in [m for m in sys.modules if m.startswith("pyverbs.")]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(RdmaUnavailable, match=r"pip install 'byteps-transport\[rdma\]'.*unset DMLC_ENABLE_RDMA"):
        Context(rdma=RdmaSettings("ib0"))


def _why_no_rdma() -> str:
    try:
        import pyverbs.device
    except ImportError as exc:
        return f"pyverbs cannot be imported ({exc}): no RDMA here"
    if not pyverbs.device.get_device_list():
        return "pyverbs lists no RDMA device (soft-RoCE: rdma link add rxe0 type rxe netdev IF)"
    return ""


@pytest.mark.skipif(bool(_why_no_rdma()), reason=_why_no_rdma() or "an RDMA device is here")
def test_loopback_on_a_real_rdma_device():
    """Two processes, one RDMA device, real queue pairs: the echo child doubles what it is sent."""
    child_code = CHILD.replace("verbs_stand_in.install()", "pass")
    child = subprocess.Popen([sys.executable, "-c", child_code], stdout=subprocess.PIPE, text=True,
                             env={**os.environ})
    context = Context(rdma=RdmaSettings(os.environ.get("DMLC_INTERFACE"),
                                        int(os.environ.get("BYTEPS_RDMA_GID_INDEX", "0"))))
    try:
        connection = context.connect(child.stdout.readline().strip(), max_payload_bytes=1 << 24)
        echo_rounds(connection, 5, 1_000_000)
        assert connection.counters.rdma_sent == 4
        connection.send(Command.BARRIER, 1)
        connection.close(0)
    finally:
        child.wait(10) if child.poll() is None else None
        child.kill()
        context.close()


@pytest.mark.parametrize("max_inline_data", [64, 0])
def test_large_payloads_free_every_page_whatever_the_inline_limit(max_inline_data):
    """4 MB and 16 MB payloads both ways for 50 rounds: every one written, every page back, nothing inline.

    A 16 MB payload fills half the ring, so one page list that is never returned sends the next-but-one
    payload inline: freeing pages must not depend on how many bytes the queue pair takes inline.
    """
    verbs_stand_in.install(max_inline_data=max_inline_data)
    ctx = Context(rdma=RdmaSettings())
    listener = ctx.listen("tcp://127.0.0.1:0", max_payload_bytes=1 << 25)
    connection = ctx.connect(listener.address, max_payload_bytes=1 << 25)
    try:
        identity = connect(listener, connection)
        for count in (1 << 20, 1 << 22):  # float32: 4 MB, 16 MB
            data = np.arange(count, dtype=np.float32)
            back = np.empty_like(data)
            sent, answered = connection.counters.rdma_sent, listener.counters.rdma_sent
            for round_ in range(50):
                data[0] = round_
                connection.send(Command.PUSH, 1, key=count, round=round_, payload=data)
                message = listener.recv()
                received = np.frombuffer(message.payload, np.float32)
                assert received[0] == round_ and np.array_equal(received[1:], data[1:])
                del received
                listener.send(Command.PULL_RESPONSE, 0, key=count, payload=message.payload, identity=identity)
                del message  # the listener's view of the connection's pages, once the answer was written
                connection.recv(lambda header, back=back: back.view(np.uint8))
                assert back[0] == round_ and np.array_equal(back, data)
            assert connection.counters.rdma_sent - sent == 50 and listener.counters.rdma_sent - answered == 50
            assert connection.peer.pages_in_use() == 0 and listener.peers[identity].pages_in_use() == 0
    finally:
        connection.close(0)
        listener.close(0)
        verbs.use_device(None)
        ctx.zmq.destroy(linger=0)


def test_a_tensor_sent_again_under_its_key_is_registered_once_and_written_without_a_copy(pair):
    listener, connection = pair
    connect(listener, connection)
    device = verbs_stand_in.made[0]
    tensor = np.zeros(1 << 20, np.float32)  # 4 MB, sent again and again from the same memory (key 7)
    for round_ in range(6):
        tensor[:] = round_  # changed in place between sends: the write must read it then, not a stale copy
        connection.send(Command.PUSH, 1, key=7, payload=tensor)
        received = np.frombuffer(listener.recv().payload, np.float32)
        assert received[0] == round_ and received[-1] == round_
        del received
    peer = connection.peer
    assert device.registrations == 1 and connection.counters.rdma_zero_copy == 5  # the 1st send stages, 2nd registers
    assert peer.staged_bytes == MIN_RDMA_BYTES + tensor.nbytes and peer.direct_bytes == 5 * tensor.nbytes
    other = np.full_like(tensor, 9)  # the key moves to other memory: the old buffer is let go
    for _ in range(2):
        connection.send(Command.PUSH, 1, key=7, payload=other)
        assert np.frombuffer(listener.recv().payload, np.float32)[0] == 9
    assert device.registrations == 2 and 7 in peer._registered and peer._registered[7].view.obj is not tensor
    temporary = [np.full(MIN_RDMA_BYTES, i, np.uint8) for i in range(3)]  # a fresh buffer each time: staged
    for index, payload in enumerate(temporary):
        connection.send(Command.PUSH, 1, key=8, payload=payload)
        assert bytes(listener.recv().payload[:1]) == bytes([index])
    assert device.registrations == 2 and peer.pages_in_use() == 0


def test_a_failed_page_freeing_write_ends_the_connection_instead_of_falling_back(pair):
    listener, connection = pair
    identity = connect(listener, connection)
    payload = np.ones(MIN_RDMA_BYTES, np.uint8)
    listener.send(Command.PULL_RESPONSE, 0, payload=payload, identity=identity)
    message = connection.recv()
    connection.peer.qp.state = verbs_stand_in.ERROR  # its queue pair broke (as after a failed write)
    del message  # the connection frees the listener's pages: that write fails
    sent = connection.counters.messages_sent
    with pytest.raises(NodeFailure, match="the RDMA connection ended: returning 1 freed ring pages"):
        connection.send(Command.PUSH, 1, payload=payload)  # no silent fallback to TCP
    assert connection.counters.messages_sent == sent
    with pytest.raises(NodeFailure, match="the RDMA connection ended"):
        connection.recv()


def test_a_listener_whose_page_freeing_write_fails_refuses_that_peer_and_serves_the_others(pair, context):
    listener, connection = pair
    identity = connect(listener, connection)
    other = context.connect(listener.address, max_payload_bytes=1 << 26)
    other_identity = connect(listener, other)
    payload = np.ones(MIN_RDMA_BYTES, np.uint8)
    connection.send(Command.PUSH, 1, payload=payload)
    message = listener.recv()
    listener.peers[identity].qp.state = verbs_stand_in.ERROR
    del message  # the listener frees the connection's pages: that write fails
    connection.send(Command.PULL, 1, key=3)
    with pytest.raises(FrameError, match="the RDMA connection ended.*the peer must reconnect") as info:
        listener.recv()
    assert info.value.identity == identity and identity not in listener.peers
    other.send(Command.PUSH, 1, payload=payload)
    message = listener.recv()
    assert message.identity == other_identity and listener.counters.rdma_received == 4
    other.close(0)
