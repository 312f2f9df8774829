"""The co-located fast path: large payloads between processes of one host through shared memory.

When a worker and a server share a host (servers co-located on the worker
machines, or every process on one machine), their bytes need not cross
TCP: the kernel would copy each payload into a socket buffer and out of it
again, and ZeroMQ's I/O threads would move it in between. BytePS has the
same idea behind ``BYTEPS_ENABLE_IPC``.

Here ZeroMQ still carries every message (identity, header), so framing,
authentication and failure detection stay those of TCP; only a large
payload's bytes move through a *ring* of shared memory the sender owns:

- the sender copies the payload into free pages of its ring (one copy) and
  sends, in place of the payload, an empty marker frame and a 40-byte
  reference (:data:`REFERENCE`);
- the receiver maps the sender's ring once, through
  ``/proc/<pid>/fd/<fd>`` (a ``memfd``: no name to clean up, freed by the
  kernel when the last process lets go), and hands the payload on as a view
  of those pages (no copy), or copies it straight into the caller's buffer;
- the pages are free again when the last view of them goes, as ZeroMQ
  frees a received message: the receiver marks them free in the ring's
  page table, which the sender reads when it looks for room.

A ring that is full (the receiver still holds what it was sent), or a
payload below :data:`MIN_SHARED_BYTES`, goes inline over TCP as before.
A connection uses its ring when it was told to (``Context(shared_memory=
True)``) and the listener's address is one of this host's; a listener
answers a peer through its own ring once that peer has sent it a payload
through one (the peer is then known to share the host and to see this
process). Every endpoint understands references, whether it sends them or
not.

Wire form, for a payload through shared memory::

    [identity,] header, b"" (marker), reference

An empty frame followed by another one occurs nowhere else: an inline
payload is always a message's last frame.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import secrets
import socket
import struct
import weakref
from typing import Any, Dict, Optional, Set, Tuple

import zmq

from byteps.transport.endpoint import payload_nbytes
from byteps.transport.frames import FrameError
from byteps.transport.zmq_endpoints import ZmqConnection, ZmqListener

__all__ = [
    "SharedConnection",
    "SharedListener",
    "SharedRing",
    "PeerRing",
    "is_local_address",
    "MIN_SHARED_BYTES",
    "RING_BYTES",
    "REFERENCE",
]

log = logging.getLogger("byteps.transport.co_located")

#: Payloads below this go inline: for them a socket costs no more than the ring's bookkeeping.
MIN_SHARED_BYTES = 64 << 10
#: The ring's unit of allocation; a payload takes whole pages.
PAGE_BYTES = 16 << 10
#: Pages in one ring (32 MiB of address space; only the pages used are ever backed by memory).
RING_PAGES = 2048
_MAGIC = b"BPSRING1"
_TABLE_OFFSET = 64  # the page table: one byte per page, 0 = free
_DATA_OFFSET = 4096 * (1 + (_TABLE_OFFSET + RING_PAGES) // 4096)
RING_BYTES = _DATA_OFFSET + RING_PAGES * PAGE_BYTES
#: ring id, pid, fd, the ring's size, the payload's offset in it, its bytes
REFERENCE = struct.Struct("<QIIQQQ")
_MARKER = b""


def is_local_address(host: str) -> bool:
    """Whether ``host`` is an address of this host (its network namespace): a listener there shares our memory."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((host, 0))
        except OSError:
            return False
    return True


def payload_pages(payload: Any, runs: Dict[int, Tuple[bytes, bytes]]) -> Optional[Tuple[memoryview, bytes, bytes]]:
    """(the payload's bytes, the free marks and the used marks of as many pages) in a ring's page table (one
    byte per page, 0 = free); None when no ring holds it. ``runs`` caches the marks by length."""
    source = _bytes_of(payload)
    pages = -(-source.nbytes // PAGE_BYTES)
    if pages > RING_PAGES:
        return None
    free, used = runs.get(pages) or runs.setdefault(pages, (bytes(pages), b"\x01" * pages))
    return source, free, used


def _bytes_of(payload: Any) -> memoryview:
    view = memoryview(payload)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def view_until_released(buffer: Any, offset: int, nbytes: int, release: Any, *args: Any) -> memoryview:
    """``nbytes`` of ``buffer`` at ``offset``, in place; ``release(*args)`` runs once this view and every view
    made from it are gone (when ZeroMQ would free a received message)."""
    holder = (ctypes.c_char * nbytes).from_buffer(buffer, offset)
    weakref.finalize(holder, release, *args)
    return memoryview(holder).cast("B")


def copy_bytes(target: Any, source: memoryview) -> None:
    """As many of ``source``'s bytes as ``target`` holds, into ``target`` (the endpoint compares the sizes)."""
    destination = _bytes_of(target)
    copied = min(source.nbytes, destination.nbytes)
    destination[:copied] = source[:copied]


class SharedRing:
    """The sender's side: a memfd of :data:`RING_PAGES` pages and the table of which are free."""

    def __init__(self) -> None:
        self.ring_id = secrets.randbits(64)
        self.fd = os.memfd_create("byteps-ring", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, RING_BYTES)
            self.mapping = mmap.mmap(self.fd, RING_BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError:
            os.close(self.fd)
            raise
        self.mapping[0:16] = _MAGIC + struct.pack("<Q", self.ring_id)
        self.view = memoryview(self.mapping)
        self.pid = os.getpid()
        self._runs: Dict[int, Tuple[bytes, bytes]] = {}  # pages -> (that many free marks, that many used marks)

    def put(self, payload: Any) -> Optional[bytes]:
        """Copy ``payload`` into free pages; returns its reference, or None when the ring has no room."""
        claim = payload_pages(payload, self._runs)
        if claim is None:
            return None
        source, free, used = claim
        nbytes, pages = source.nbytes, len(free)
        # Lowest free pages first: pages freed a moment ago are reused while still in the CPU's caches.
        found = self.mapping.find(free, _TABLE_OFFSET, _TABLE_OFFSET + RING_PAGES)
        if found < 0:
            return None
        self.mapping[found:found + pages] = used
        offset = _DATA_OFFSET + (found - _TABLE_OFFSET) * PAGE_BYTES
        self.view[offset:offset + nbytes] = source
        return REFERENCE.pack(self.ring_id, self.pid, self.fd, RING_BYTES, offset, nbytes)

    def pages_in_use(self) -> int:
        return RING_PAGES - self.mapping[_TABLE_OFFSET:_TABLE_OFFSET + RING_PAGES].count(0)

    def close(self) -> None:
        self.view.release()
        self.mapping.close()
        os.close(self.fd)


class PeerRing:
    """The receiver's side: another process's ring, mapped once; views of it free their pages when they go."""

    def __init__(self, ring_id: int, pid: int, fd: int, nbytes: int) -> None:
        path = f"/proc/{pid}/fd/{fd}"
        if nbytes != RING_BYTES:
            raise FrameError(f"a shared-memory ring of {nbytes} bytes (this process knows {RING_BYTES}-byte "
                             "rings: the peer runs another byteps-transport)")
        try:
            handle = os.open(path, os.O_RDWR)
        except OSError as exc:
            raise FrameError(
                f"cannot open the peer's shared memory {path}: {exc.strerror}. The peer shares this host's "
                "network address but not its processes (another PID namespace or user?): set "
                "BYTEPS_ENABLE_IPC=0 on the workers") from None
        try:
            status = os.fstat(handle)
            if status.st_uid != os.getuid() or status.st_size != nbytes:
                raise FrameError(f"{path} is not a byteps ring of this user ({status.st_size} bytes, "
                                 f"uid {status.st_uid})")
            self.mapping = mmap.mmap(handle, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(handle)
        if self.mapping[0:16] != _MAGIC + struct.pack("<Q", ring_id):
            self.mapping.close()
            raise FrameError(f"{path} is not the ring the peer named (it closed it?)")
        self.ring_id = ring_id

    def _pages(self, offset: int, nbytes: int) -> Tuple[int, int]:
        if (offset < _DATA_OFFSET or (offset - _DATA_OFFSET) % PAGE_BYTES or nbytes <= 0
                or offset + nbytes > RING_BYTES):
            raise FrameError(f"a shared-memory reference outside its ring (offset {offset}, {nbytes} bytes)")
        return _TABLE_OFFSET + (offset - _DATA_OFFSET) // PAGE_BYTES, -(-nbytes // PAGE_BYTES)

    def view(self, offset: int, nbytes: int) -> memoryview:
        """The payload in place; its pages are freed when this view and every view made from it are gone."""
        first, pages = self._pages(offset, nbytes)
        return view_until_released(self.mapping, offset, nbytes, _free_pages, self.mapping, first, pages)

    def copy_into(self, target: Any, offset: int, nbytes: int) -> int:
        """Copy the payload into ``target`` and free its pages at once; returns the bytes copied."""
        first, pages = self._pages(offset, nbytes)
        with memoryview(self.mapping) as ring:
            copy_bytes(target, ring[offset:offset + nbytes])
        _free_pages(self.mapping, first, pages)
        return nbytes

    def close(self) -> None:
        try:
            self.mapping.close()
        except BufferError:
            pass  # a received view is still alive: the mapping goes with it


def _free_pages(mapping: mmap.mmap, first: int, pages: int) -> None:
    if not mapping.closed:
        mapping[first:first + pages] = bytes(pages)


class _SharedPayloads:
    """What both endpoints add to ZeroMQ's: references received, and sent through a ring when allowed."""

    def _setup(self, context: Any) -> None:
        self.sends_shared = bool(getattr(context, "shared_memory", False))
        self._peer_rings: Dict[int, PeerRing] = {}

    def _ring_for(self, identity: Optional[bytes]) -> Optional[SharedRing]:
        raise NotImplementedError

    def _send_frames(self, identity: Optional[bytes], header: bytes, payload: Any) -> None:
        if payload is not None and self.sends_shared and payload_nbytes(payload) >= MIN_SHARED_BYTES:
            ring = self._ring_for(identity)
            try:
                reference = ring.put(payload) if ring is not None else None
            except (TypeError, ValueError):  # not one contiguous block of bytes: ZeroMQ says what is wrong
                reference = None
            if reference is not None:
                frames = [header, _MARKER, reference] if identity is None else [identity, header, _MARKER, reference]
                self._send_parts(frames)
                self.counters.shared_sent += 1
                return
        super()._send_frames(identity, header, payload)

    def _reference(self) -> Tuple[PeerRing, int, int]:
        """After the marker: read the reference frame and map its ring (once per ring)."""
        frame = self.socket.recv(copy=False)
        self._last = frame
        if len(frame) != REFERENCE.size:
            raise FrameError(f"a shared-memory reference of {len(frame)} bytes, expected {REFERENCE.size}")
        ring_id, pid, fd, nbytes, offset, length = REFERENCE.unpack(frame.buffer)
        ring = self._peer_rings.get(ring_id)
        if ring is None:
            ring = self._peer_rings[ring_id] = PeerRing(ring_id, pid, fd, nbytes)
        self.counters.shared_received += 1
        self._peer_is_local()
        return ring, offset, length

    def _peer_is_local(self) -> None:
        pass

    def _recv_payload(self) -> memoryview:
        frame = self.socket.recv(copy=False)
        self._last = frame
        if len(frame) or not frame.more:
            return frame.buffer
        ring, offset, nbytes = self._reference()
        return ring.view(offset, nbytes)

    def _recv_payload_into(self, target: Any) -> int:
        nbytes = self.socket.recv_into(target)
        self._last = None
        if nbytes or not self.socket.get(zmq.RCVMORE):
            return nbytes
        ring, offset, length = self._reference()
        return ring.copy_into(target, offset, length)

    def _close_rings(self) -> None:
        for ring in self._peer_rings.values():
            ring.close()
        self._peer_rings.clear()


class SharedConnection(_SharedPayloads, ZmqConnection):
    """A DEALER that sends large payloads through its ring when the listener is on this host."""

    def __init__(self, context: Any, address: str, max_payload_bytes: int = 1 << 32) -> None:
        super().__init__(context, address, max_payload_bytes)
        self._setup(context)
        scheme, _, rest = address.partition("://")
        self.sends_shared = self.sends_shared and scheme == "tcp" and is_local_address(rest.rpartition(":")[0])
        self._ring: Optional[SharedRing] = None

    def _ring_for(self, identity: Optional[bytes]) -> Optional[SharedRing]:
        if self._ring is None:
            try:
                self._ring = SharedRing()
            except OSError as exc:
                log.warning("no shared memory toward %s (%s): payloads go over TCP", self.address, exc)
                self.sends_shared = False
                return None
        return self._ring

    def _close(self, linger_ms: Optional[int]) -> None:
        super()._close(linger_ms)
        self._close_rings()
        if self._ring is not None:
            self._ring.close()
            self._ring = None


class SharedListener(_SharedPayloads, ZmqListener):
    """A ROUTER that answers a peer through a ring of its own once the peer has sent through one."""

    def __init__(self, context: Any, address: str, max_payload_bytes: int = 1 << 32) -> None:
        super().__init__(context, address, max_payload_bytes)
        self._setup(context)
        self._identity: Optional[bytes] = None  # the sender of the message being received
        self._local_peers: Set[bytes] = set()
        self._rings: Dict[bytes, SharedRing] = {}

    def _recv_identity(self) -> bytes:
        self._identity = super()._recv_identity()
        return self._identity

    def _peer_is_local(self) -> None:
        self._local_peers.add(self._identity)

    def _ring_for(self, identity: Optional[bytes]) -> Optional[SharedRing]:
        if identity not in self._local_peers:
            return None
        ring = self._rings.get(identity)
        if ring is None:
            try:
                ring = self._rings[identity] = SharedRing()
            except OSError as exc:
                log.warning("no shared memory toward a local peer (%s): its answers go over TCP", exc)
                self._local_peers.discard(identity)
                return None
        return ring

    def _close(self, linger_ms: Optional[int]) -> None:
        super()._close(linger_ms)
        self._close_rings()
        for ring in self._rings.values():
            ring.close()
        self._rings.clear()
