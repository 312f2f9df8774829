"""The endpoint interface: one validated, counted channel of byteps frames.

Like ps-lite's ``Van``, an :class:`Endpoint` has a public, non-virtual
surface (:meth:`~Endpoint.send`, :meth:`~Endpoint.recv`,
:meth:`~Endpoint.wait_readable`) that packs, validates and counts every
message, over a small protected surface that each transport implements:

=========================  ==================================================
``_send_frames``           send one header frame and an optional payload
``_recv_identity``         a listener's: who sent the next message
``_recv_first``            the header frame (a buffer) of the next message
``_recv_payload``          the payload frame, as a buffer ZeroMQ (or the
                           transport) keeps alive for the caller
``_recv_payload_into``     the payload frame, straight into a caller's buffer
``_has_more`` / ``_drain`` is another frame pending; discard the rest
``_wait``                  block until readable or the timeout
``poll_target``            what :class:`~byteps.transport.poller.Poller`
                           waits on (a ZeroMQ socket or a file descriptor)
``_close``                 release the channel
=========================  ==================================================

So byte counters, header checks and the payload-size rule cannot be bypassed
by a caller, and a new transport (shared memory, RDMA via pyverbs) writes
only the protected part. A *listener* is bound and answers many peers (each
message carries the sender's ``identity``); a *connection* talks to one
listener. Transports are chosen by address scheme in
:mod:`byteps.transport.context`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, List, NamedTuple, Optional

from byteps.transport.errors import TransportError
from byteps.transport.frames import Command, FrameError, Header, decode_header, encode_header

__all__ = ["ByteCounters", "Message", "Endpoint", "Destination"]

#: ``destination(header)`` returns a writable buffer of ``header.payload_bytes`` bytes, or None.
Destination = Callable[[Header], Any]


@dataclasses.dataclass
class ByteCounters:
    """Bytes and messages that crossed one endpoint, headers included."""

    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0
    shared_sent: int = 0  # payloads that went through shared memory (co_located.py), counted above too
    shared_received: int = 0
    rdma_sent: int = 0  # payloads that went by RDMA WRITE (rdma_endpoints.py), counted above too
    rdma_received: int = 0
    rdma_zero_copy: int = 0  # of rdma_sent: written straight from the caller's registered buffer, not staged


class Message(NamedTuple):
    header: Header
    payload: Optional[memoryview]  # None when absent or received into a caller's buffer
    identity: Optional[bytes]  # the sender, on a listener; None on a connection

    def text(self, absent: str = "(no text)") -> str:
        """The payload as text (an ERROR's reason), undecodable bytes replaced; ``absent`` without a payload."""
        return bytes(self.payload).decode(errors="replace") if self.payload is not None else absent


def payload_nbytes(payload: Any) -> int:
    if payload is None:
        return 0
    if isinstance(payload, (bytes, bytearray)):
        return len(payload)
    return memoryview(payload).nbytes


class Endpoint:
    """One channel of byteps frames; subclasses implement the protected methods."""

    routed = False  # a listener: every message names its peer (identity)
    address: str = ""

    def __init__(self, max_payload_bytes: int) -> None:
        self.max_payload_bytes = max_payload_bytes
        self.counters = ByteCounters()

    # --- the public surface: validates and counts -----------------------------------
    def send(
        self,
        command: int,
        sender: int,
        key: int = 0,
        round: int = 0,
        payload: Any = None,
        dtype: int = 0,
        flags: int = 0,
        aux: int = 0,
        identity: Optional[bytes] = None,
    ) -> None:
        """Send one message; ``payload`` is any buffer and is not copied."""
        nbytes = payload_nbytes(payload)
        header = encode_header(command, sender, key, round, nbytes, dtype, flags, aux)
        if self.routed and identity is None:
            raise TransportError("a listener must name the peer (identity) it answers")
        self._send_frames(identity if self.routed else None, header, payload)
        self.counters.bytes_sent += len(header) + nbytes
        self.counters.messages_sent += 1

    def recv(self, destination: Optional[Destination] = None) -> Message:
        """Receive one message; raises FrameError for a malformed one.

        ``destination(header)`` may return a writable buffer of exactly
        ``header.payload_bytes`` bytes: the payload is then received straight
        into it (one copy) and ``payload`` is None. The whole message is
        always consumed, even when invalid, so that one bad message never
        desynchronises the stream.
        """
        identity = self._recv_identity() if self.routed else None
        try:
            return self._recv_message(identity, destination)
        except FrameError as exc:
            exc.identity = identity  # so a listener can answer the bad peer
            raise

    def _recv_message(self, identity: Optional[bytes], destination: Optional[Destination]) -> Message:
        first = self._recv_first()
        try:
            header = decode_header(first, self.max_payload_bytes)
        except FrameError:
            self._drain()
            raise
        payload = None
        received = len(first)
        if self._has_more():
            target = destination(header) if destination is not None else None
            if target is not None:
                nbytes = self._recv_payload_into(target)
                if nbytes != header.payload_bytes or nbytes > memoryview(target).nbytes:
                    self._drain()
                    raise FrameError(
                        f"payload of {nbytes} bytes for key {header.key}, header announced "
                        f"{header.payload_bytes} and the destination holds {memoryview(target).nbytes}"
                    )
            else:
                payload = self._recv_payload()
                nbytes = payload.nbytes
            received += nbytes
            if self._has_more():
                self._drain()
                raise FrameError("message has more than one payload frame")
            if nbytes != header.payload_bytes:
                raise FrameError(f"payload is {nbytes} bytes, header announced {header.payload_bytes}")
        elif header.payload_bytes:
            raise FrameError(f"header announced a {header.payload_bytes}-byte payload that is missing")
        self.counters.bytes_received += received
        self.counters.messages_received += 1
        return Message(header, payload, identity)

    def wait_readable(self, timeout_s: Optional[float]) -> bool:
        """True once a message can be received; False after ``timeout_s`` (None: forever)."""
        return self._wait(None if timeout_s is None else max(0, int(timeout_s * 1000)))

    def recv_or_refuse(self, sender: int, log: logging.Logger) -> Optional[Message]:
        """Receive one message; a malformed one is logged, answered with an ERROR and None returned.

        This is how listeners survive bad peers: the peer learns what was
        wrong, everyone else carries on.
        """
        try:
            return self.recv()
        except FrameError as exc:
            log.error("dropped a malformed message: %s", exc)
            identity = getattr(exc, "identity", None)
            if identity is not None:
                self.send(Command.ERROR, sender, payload=str(exc).encode(), identity=identity)
            return None

    def close(self, linger_ms: Optional[int] = None) -> None:
        """Close the channel; ``linger_ms`` bounds how long unsent messages are kept trying."""
        self._close(linger_ms)

    # --- the protected surface: one transport's implementation --------------------------
    def _send_frames(self, identity: Optional[bytes], header: bytes, payload: Any) -> None:
        raise NotImplementedError

    def _recv_identity(self) -> bytes:
        raise NotImplementedError

    def _recv_first(self) -> memoryview:
        raise NotImplementedError

    def _recv_payload(self) -> memoryview:
        raise NotImplementedError

    def _recv_payload_into(self, target: Any) -> int:
        raise NotImplementedError

    def _has_more(self) -> bool:
        raise NotImplementedError

    def _drain(self) -> None:
        raise NotImplementedError

    def _wait(self, timeout_ms: Optional[int]) -> bool:
        raise NotImplementedError

    def poll_target(self) -> Any:
        """What a :class:`~byteps.transport.poller.Poller` waits on for this endpoint."""
        raise NotImplementedError

    def _close(self, linger_ms: Optional[int]) -> None:
        raise NotImplementedError


def frames_of(identity: Optional[bytes], header: bytes, payload: Any) -> List[Any]:
    """The multipart frames of one message, for transports that send frame lists."""
    frames: List[Any] = [] if identity is None else [identity]
    frames.append(header)
    if payload is not None:
        frames.append(payload)
    return frames
