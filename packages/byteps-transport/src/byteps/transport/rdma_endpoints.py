"""The RDMA transport: payloads by RDMA WRITE, with ZeroMQ over TCP carrying every message's header.

BytePS runs on TCP or RDMA (``DMLC_ENABLE_RDMA=1``). Here, as on the
co-located path (:mod:`byteps.transport.co_located`), ZeroMQ still carries
every message (identity, header, small payloads). Framing, the Gate's
authentication, heartbeats and failure detection therefore stay those of
TCP. Only a large payload's bytes move differently: by RDMA WRITE, through
one reliable-connected queue pair per connection (:mod:`byteps.transport.verbs`).

Each side of a connection keeps, per peer:

- a **ring** of :data:`RING_PAGES` pages that the peer writes payloads into.
  It is registered memory that the peer may write;
- a **page table** saying which pages of the *peer's* ring this side has
  filled. The peer writes zeros into it when it is done with them, so the
  table is registered writable too;
- **registered sources**: per message key (a tensor's name), the caller's
  buffer that key was last sent from, registered once it is sent from the
  same memory a second time, and written from directly after that (no copy
  on the sender). BytePS registers a tensor's memory once per name the same
  way. A registered buffer is kept alive (so its address cannot be reused)
  until the key is sent from other memory or the peer closes;
- a **staging** buffer, registered, that any other payload is copied into
  before the write (one copy on the sender);
- **zeros**: registered memory that is never written, the source of the
  writes that free pages.

A payload of :data:`MIN_RDMA_BYTES` or more is written into free pages of
the peer's ring, from its registered source or from staging. Once the write
is placed, the message goes over ZeroMQ with a 24-byte reference
(:data:`REFERENCE`) in place of the payload. The receiver hands the payload
on as a view of its ring (no copy), or copies it into the caller's buffer.
When the last view goes, it frees the pages by writing zeros, from its
registered zeros, into the sender's page table. That write is an ordinary
waited one: it never depends on how many bytes the queue pair takes inline
(a page list of a 16 MB payload is 1,024 bytes). If it fails, the
connection ends: the connection's next send or receive raises the
:class:`NodeFailure`, and the listener refuses that peer's messages naming
the failure. A ring that has no room, or a payload that is not one
contiguous block, goes inline over TCP.

The queue pairs connect in-band, on the traffic itself, with no extra round
trip:

1. a connection's first large payload goes inline, followed by a HELLO:
   its queue pair, ring and table;
2. the listener connects a queue pair of its own to that peer, and its next
   message to the peer carries a WELCOME with the same of its own;
3. the connection connects its queue pair and writes from then on;
4. the listener writes its answers once the peer's first reference arrived,
   since the peer is then known to be connected.

Wire forms (an empty frame followed by another occurs nowhere else)::

    [identity,] header, b"", reference                          a payload by RDMA WRITE
    [identity,] header[, payload], b"", HELLO | WELCOME blob    a handshake, after the message's own frames
"""

from __future__ import annotations

import collections
import ctypes
import json
import logging
import struct
from typing import Any, Deque, Dict, Optional, Set, Tuple

from byteps.transport.co_located import PAGE_BYTES, RING_PAGES, copy_bytes, payload_pages, view_until_released
from byteps.transport.endpoint import payload_nbytes
from byteps.transport.errors import NodeFailure
from byteps.transport.frames import FrameError
from byteps.transport.verbs import Device, MemoryRegion
from byteps.transport.zmq_endpoints import ZmqConnection, ZmqListener

__all__ = ["RdmaConnection", "RdmaListener", "RdmaPeer", "MIN_RDMA_BYTES", "RING_PAGES", "PAGE_BYTES", "REFERENCE"]

log = logging.getLogger("byteps.transport.rdma")

#: Payloads below this go inline over TCP.
MIN_RDMA_BYTES = 16 << 10
#: The ring's pages are the co-located ring's (PAGE_BYTES, RING_PAGES): 32 MiB per peer and direction.
RING_BYTES = RING_PAGES * PAGE_BYTES
_MAGIC = b"BPSRDMA1"
_HELLO = b"BPSRDMAH"
_WELCOME = b"BPSRDMAW"
#: magic, the payload's offset in the receiver's ring, its bytes
REFERENCE = struct.Struct("<8sQQ")
_KEY = struct.Struct("<Q")  # a header's key, at byte 16 (frames.py)
_MARKER = b""


class RdmaPeer:
    """Both directions with one peer: the queue pair, this side's ring, table and staging, and the peer's."""

    def __init__(self, device: Device) -> None:
        self.qp = device.queue_pair()
        self.ring = device.allocate(RING_BYTES)  # the peer writes payloads here
        self.table = device.allocate(RING_PAGES)  # which pages of the peer's ring this side filled
        self.table.view[:] = bytes(RING_PAGES)
        self._zeros = device.allocate(RING_PAGES)  # never written: the source of every page-freeing write
        self._zeros.view[:] = bytes(RING_PAGES)
        self._device = device
        self._staging: Optional[MemoryRegion] = None
        self._registered: Dict[Any, MemoryRegion] = {}  # key -> the caller's buffer, registered (kept alive)
        self._seen: Dict[Any, Tuple[int, int]] = {}  # key -> (address, bytes) it was last sent from
        self.failure: Optional[NodeFailure] = None  # why this connection ended (a control write failed)
        self.staged_bytes = 0  # payload bytes copied into staging before their write
        self.direct_bytes = 0  # payload bytes written straight from a registered caller's buffer
        self.remote_ring: Optional[Tuple[int, int]] = None  # (address, rkey)
        self.remote_table: Optional[Tuple[int, int]] = None
        self.connected = False
        self.closed = False
        self._runs: Dict[int, Tuple[bytes, bytes]] = {}

    def blob(self, kind: bytes) -> bytes:
        """HELLO or WELCOME: what the peer needs to write to this side."""
        fields = {"qp": self.qp.info().decode(), "ring": [self.ring.address, self.ring.rkey, RING_BYTES],
                  "table": [self.table.address, self.table.rkey, RING_PAGES], "page": PAGE_BYTES}
        return kind + json.dumps(fields).encode()

    def connect(self, blob: bytes) -> None:
        """Connect to the peer that sent ``blob`` (its HELLO or WELCOME)."""
        try:
            fields = json.loads(bytes(blob[len(_HELLO):]))
            ring, table = fields["ring"], fields["table"]
            if (ring[2], table[2], fields["page"]) != (RING_BYTES, RING_PAGES, PAGE_BYTES):
                raise FrameError(f"the peer's RDMA ring is {ring[2]} bytes in pages of {fields['page']} (this "
                                 f"process knows {RING_BYTES} in pages of {PAGE_BYTES}): it runs another "
                                 "byteps-transport")
            self.qp.connect(fields["qp"].encode())
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise FrameError(f"a malformed RDMA handshake ({exc})") from None
        self.remote_ring, self.remote_table = (ring[0], ring[1]), (table[0], table[1])
        self.connected = True

    # --- sending ---------------------------------------------------------------------
    def check(self) -> None:
        """Raise why this connection ended, if it did."""
        if self.failure is not None:
            raise self.failure

    def put(self, payload: Any, key: Any = None) -> Optional[bytes]:
        """Write ``payload`` into free pages of the peer's ring; its reference, or None when there is no room.

        ``key`` names the payload's tensor: a buffer sent under the same key
        from the same memory twice is registered and written from directly.
        Raises TypeError/ValueError/BufferError for a payload that is not one
        contiguous block (before anything is written), and NodeFailure when
        the write fails.
        """
        self.check()
        claim = payload_pages(payload, self._runs)
        if claim is None:
            return None
        source, free, used = claim
        nbytes, pages = source.nbytes, len(free)
        found = bytes(self.table.view).find(free)  # the peer zeroes what it is done with
        if found < 0:
            return None
        region, start = self._registered_source(source, key)
        if region is None:
            if self._staging is None:
                self._staging = self._device.allocate(RING_BYTES)
            region, start = self._staging, 0
            region.view[:nbytes] = source
            self.staged_bytes += nbytes
        else:
            self.direct_bytes += nbytes
        self.table.view[found:found + pages] = used
        offset = found * PAGE_BYTES
        self.qp.write(region, start, nbytes, self.remote_ring[0] + offset, self.remote_ring[1])
        return REFERENCE.pack(_MAGIC, offset, nbytes)

    def _registered_source(self, source: memoryview, key: Any) -> Tuple[Optional[MemoryRegion], int]:
        """(the registered region holding ``source``, where in it), registering ``source`` on its second send
        under ``key``; (None, 0) when it is to be staged."""
        if source.readonly:
            return None, 0
        address, nbytes = ctypes.addressof(ctypes.c_char.from_buffer(source)), source.nbytes
        ring = self.ring  # a payload received from this peer, sent back: its ring is registered already
        if ring.address <= address and address + nbytes <= ring.address + ring.nbytes:
            return ring, address - ring.address  # and the write is waited for, so the view may go after it
        if key is None:
            return None, 0
        region = self._registered.get(key)
        if region is not None:
            if (region.address, region.nbytes) == (address, nbytes):
                return region, 0
            del self._registered[key]  # the key moved to other memory: let the old buffer go
            region.close()
        if self._seen.get(key) != (address, nbytes):
            self._seen[key] = (address, nbytes)  # once is not yet a tensor's home: a temporary, perhaps
            return None, 0
        region = self._registered[key] = self._device.register(source)
        return region, 0

    def pages_in_use(self) -> int:
        return RING_PAGES - bytes(self.table.view).count(0)

    # --- receiving -------------------------------------------------------------------
    def _pages(self, reference: Any) -> Tuple[int, int, int, int]:
        if len(reference) != REFERENCE.size:
            raise FrameError(f"an RDMA reference of {len(reference)} bytes, expected {REFERENCE.size}")
        magic, offset, nbytes = REFERENCE.unpack(reference)
        if magic != _MAGIC or offset % PAGE_BYTES or nbytes <= 0 or offset + nbytes > RING_BYTES:
            raise FrameError(f"an RDMA reference outside its ring (offset {offset}, {nbytes} bytes)")
        return offset, nbytes, offset // PAGE_BYTES, -(-nbytes // PAGE_BYTES)

    def view(self, reference: Any) -> memoryview:
        """The payload in place; its pages are freed when this view and every view made from it are gone."""
        offset, nbytes, first, pages = self._pages(reference)
        return view_until_released(self.ring.view, offset, nbytes, self._free, first, pages)

    def copy_into(self, target: Any, reference: Any) -> int:
        """Copy the payload into ``target`` and free its pages at once; returns the payload's bytes."""
        offset, nbytes, first, pages = self._pages(reference)
        copy_bytes(target, self.ring.view[offset:offset + nbytes])
        self._free(first, pages)
        return nbytes

    def _free(self, first: int, pages: int) -> None:
        """Zero ``pages`` entries of the peer's table from ``first``: those pages of this ring are free again."""
        if self.closed:
            return
        try:
            self.qp.write(self._zeros, 0, pages, self.remote_table[0] + first, self.remote_table[1])
        except Exception as exc:  # noqa: BLE001 -- a finalizer must not raise: the connection ends instead
            self.failure = NodeFailure(f"the RDMA connection ended: returning {pages} freed ring pages to the "
                                       f"peer failed ({exc})")
            log.error("%s", self.failure)
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for region in self._registered.values():
            region.close()
        self._registered.clear()
        self.qp.close()


class _RdmaPayloads:
    """What both endpoints add to ZeroMQ's: payloads by RDMA WRITE, handshakes, and a message read whole."""

    def _setup(self, context: Any) -> None:
        self.device: Device = context.rdma_device()
        self._frames: Deque[Any] = collections.deque()
        self._sender: Optional[RdmaPeer] = None  # the peer of the message being received

    def _peer_for_send(self, identity: Optional[bytes]) -> Tuple[Optional[RdmaPeer], Optional[bytes]]:
        """(the peer to write to, or None; a handshake blob to add, or None)."""
        raise NotImplementedError

    def _handshake(self, blob: bytes) -> None:
        raise NotImplementedError

    def _check_peer(self, identity: Optional[bytes]) -> None:
        """Raise if the connection with this peer ended (a control write failed)."""

    def _send_frames(self, identity: Optional[bytes], header: bytes, payload: Any) -> None:
        self._check_peer(identity)
        frames = [header] if identity is None else [identity, header]
        hello = None
        if payload is not None:
            reference = None
            if payload_nbytes(payload) >= MIN_RDMA_BYTES:
                peer, hello = self._peer_for_send(identity)
                if peer is not None:
                    try:
                        memoryview(payload).cast("B")
                        contiguous = True
                    except (TypeError, ValueError, BufferError):  # not one contiguous block: inline
                        contiguous = False
                    if contiguous:
                        direct = peer.direct_bytes
                        reference = peer.put(payload, _KEY.unpack_from(header, 16)[0])
                        if reference is not None and peer.direct_bytes != direct:
                            self.counters.rdma_zero_copy += 1
            if reference is not None:
                frames += [_MARKER, reference]
                self.counters.rdma_sent += 1
            else:
                frames.append(payload)
        handshake = hello or self._pending_handshake(identity)
        if handshake is not None:
            frames += [_MARKER, handshake]
        self._send_parts(frames)

    def _pending_handshake(self, identity: Optional[bytes]) -> Optional[bytes]:
        return None

    def _recv_first(self) -> memoryview:
        frames = self.socket.recv_multipart(copy=False)
        if len(frames) >= 3 and not len(frames[-2]) and bytes(frames[-1].buffer[:8]) in (_HELLO, _WELCOME):
            blob = frames[-1].bytes
            del frames[-2:]
            self._handshake(blob)
        self._frames = collections.deque(frames[1:])
        self._check_sender()
        return frames[0].buffer

    def _has_more(self) -> bool:
        return bool(self._frames)

    def _drain(self) -> None:
        self._frames.clear()

    def _reference_peer(self) -> RdmaPeer:
        raise NotImplementedError

    def _check_sender(self) -> None:
        """Raise if the connection with the sender of the message being received ended."""

    def _recv_payload(self) -> memoryview:
        frame = self._frames.popleft()
        if len(frame) or not self._frames:
            return frame.buffer
        peer = self._reference_peer()
        view = peer.view(self._frames.popleft().buffer)
        self.counters.rdma_received += 1
        return view

    def _recv_payload_into(self, target: Any) -> int:
        frame = self._frames.popleft()
        if len(frame) or not self._frames:
            copy_bytes(target, frame.buffer)
            return len(frame)
        peer = self._reference_peer()
        nbytes = peer.copy_into(target, self._frames.popleft().buffer)
        self.counters.rdma_received += 1
        return nbytes


class RdmaConnection(_RdmaPayloads, ZmqConnection):
    """A DEALER whose large payloads go by RDMA WRITE once its queue pair is connected (after the WELCOME)."""

    def __init__(self, context: Any, address: str, max_payload_bytes: int = 1 << 32) -> None:
        super().__init__(context, address, max_payload_bytes)
        self._setup(context)
        self.peer: Optional[RdmaPeer] = None

    def _check_peer(self, identity: Optional[bytes]) -> None:
        if self.peer is not None:
            self.peer.check()

    def _check_sender(self) -> None:
        self._check_peer(None)

    def _recv_first(self) -> memoryview:
        self._check_peer(None)  # before waiting: a connection that ended receives nothing more
        return super()._recv_first()

    def _peer_for_send(self, identity: Optional[bytes]) -> Tuple[Optional[RdmaPeer], Optional[bytes]]:
        if self.peer is None:  # the first large payload: inline, with the HELLO
            self.peer = RdmaPeer(self.device)
            return None, self.peer.blob(_HELLO)
        return (self.peer if self.peer.connected else None), None

    def _handshake(self, blob: bytes) -> None:
        if not blob.startswith(_WELCOME) or self.peer is None or self.peer.connected:
            raise FrameError("an RDMA handshake this connection did not ask for")
        self.peer.connect(blob)

    def _reference_peer(self) -> RdmaPeer:
        if self.peer is None or not self.peer.connected:
            raise FrameError("an RDMA reference on a connection whose queue pair is not connected")
        return self.peer

    def _close(self, linger_ms: Optional[int]) -> None:
        super()._close(linger_ms)
        if self.peer is not None:
            self.peer.close()


class RdmaListener(_RdmaPayloads, ZmqListener):
    """A ROUTER with a queue pair per peer that said HELLO; it writes to a peer once the peer wrote to it."""

    def __init__(self, context: Any, address: str, max_payload_bytes: int = 1 << 32) -> None:
        super().__init__(context, address, max_payload_bytes)
        self._setup(context)
        self._identity: Optional[bytes] = None
        self.peers: Dict[bytes, RdmaPeer] = {}
        self._welcome: Set[bytes] = set()  # peers whose WELCOME is still to be sent
        self._writing: Set[bytes] = set()  # peers known to be connected: their first reference arrived
        self._ended: Dict[bytes, NodeFailure] = {}  # peers whose connection ended: their messages are refused

    def _recv_identity(self) -> bytes:
        self._identity = super()._recv_identity()
        return self._identity

    def _forget_ended(self, identity: Optional[bytes]) -> None:
        peer = self.peers.get(identity)
        if peer is not None and peer.failure is not None:
            del self.peers[identity]
            self._writing.discard(identity)
            self._welcome.discard(identity)
            self._ended[identity] = peer.failure

    def _check_peer(self, identity: Optional[bytes]) -> None:
        self._forget_ended(identity)  # answers to a peer whose connection ended go inline: its errors

    def _check_sender(self) -> None:
        """A message from a peer whose connection ended is refused, naming why (recv_or_refuse answers it)."""
        self._forget_ended(self._identity)
        failure = self._ended.get(self._identity)
        if failure is not None:
            self._frames.clear()
            raise FrameError(f"{failure}; the peer must reconnect")

    def _handshake(self, blob: bytes) -> None:
        if not blob.startswith(_HELLO):
            raise FrameError("a WELCOME sent to a listener")
        old = self.peers.pop(self._identity, None)
        if old is not None:  # a peer that reconnected under the same identity: start over
            old.close()
            self._writing.discard(self._identity)
        peer = RdmaPeer(self.device)
        peer.connect(blob)
        self.peers[self._identity] = peer
        self._ended.pop(self._identity, None)
        self._welcome.add(self._identity)

    def _pending_handshake(self, identity: Optional[bytes]) -> Optional[bytes]:
        if identity in self._welcome:
            self._welcome.discard(identity)
            return self.peers[identity].blob(_WELCOME)
        return None

    def _peer_for_send(self, identity: Optional[bytes]) -> Tuple[Optional[RdmaPeer], Optional[bytes]]:
        return (self.peers.get(identity) if identity in self._writing else None), None

    def _reference_peer(self) -> RdmaPeer:
        peer = self.peers.get(self._identity)
        if peer is None:
            raise FrameError("an RDMA reference from a peer that sent no HELLO")
        self._writing.add(self._identity)
        return peer

    def _close(self, linger_ms: Optional[int]) -> None:
        super()._close(linger_ms)
        for peer in self.peers.values():
            peer.close()
        self.peers.clear()
