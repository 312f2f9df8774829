"""Sockets that speak byteps frames.

An :class:`Endpoint` wraps one ZeroMQ socket. Like ps-lite's ``Van::Send``,
its public ``send``/``recv`` validate and count every message, so byte
counters and frame checks cannot be bypassed by a caller. A
:class:`Listener` is a bound ROUTER (scheduler, server); a
:class:`Connection` is a DEALER connected to one listener (worker to server,
any node to the scheduler). Payloads are sent with ``copy=False``: ZeroMQ
reads large tensor buffers in place, Python never copies them.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, List, NamedTuple, Optional

import zmq

from byteps.transport.errors import TransportError
from byteps.transport.frames import Command, FrameError, Header, decode_header, encode_header

__all__ = ["ByteCounters", "Message", "Endpoint", "Listener", "Connection", "tcp_address"]

DEFAULT_LINGER_MS = 2000


def tcp_address(host: str, port: int) -> str:
    return f"tcp://{host}:{port}"


@dataclasses.dataclass
class ByteCounters:
    """Bytes and messages that crossed one endpoint, headers included."""

    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0


class Message(NamedTuple):
    header: Header
    payload: Optional[zmq.Frame]  # None when absent or received into a caller's buffer
    identity: Optional[bytes]  # ROUTER routing id of the sender, None on a DEALER


def _payload_nbytes(payload: Any) -> int:
    if payload is None:
        return 0
    if isinstance(payload, (bytes, bytearray)):
        return len(payload)
    return memoryview(payload).nbytes


class Endpoint:
    """One validated, counted ZeroMQ socket."""

    routed = False  # ROUTER sockets prefix every message with the peer's identity

    def __init__(self, context: zmq.Context, socket_type: int, max_payload_bytes: int) -> None:
        self.socket = context.socket(socket_type)
        # Unlimited queues: a ROUTER silently drops at its high-water mark,
        # and a blocked DEALER could deadlock the worker's comm loop.
        self.socket.setsockopt(zmq.SNDHWM, 0)
        self.socket.setsockopt(zmq.RCVHWM, 0)
        self.socket.setsockopt(zmq.LINGER, DEFAULT_LINGER_MS)
        self.max_payload_bytes = max_payload_bytes
        self.counters = ByteCounters()

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
        nbytes = _payload_nbytes(payload)
        header = encode_header(command, sender, key, round, nbytes, dtype, flags, aux)
        frames: List[Any] = []
        if self.routed:
            if identity is None:
                raise TransportError("a listener must name the peer (identity) it answers")
            frames.append(identity)
        frames.append(header)
        if payload is not None:
            frames.append(payload)
        self.socket.send_multipart(frames, copy=False)
        self.counters.bytes_sent += len(header) + nbytes
        self.counters.messages_sent += 1

    def recv(self, destination: Optional[Callable[[Header], Any]] = None) -> Message:
        """Receive one message; raises FrameError for a malformed one.

        ``destination(header)`` may return a writable buffer of exactly
        ``header.payload_bytes`` bytes: the payload is then received straight
        into it (one copy, out of ZeroMQ's message) and ``payload`` is None.
        The whole multipart message is always consumed, even when invalid,
        so that one bad message never desynchronises the stream.
        """
        identity = self.socket.recv() if self.routed else None
        try:
            return self._recv_frames(identity, destination)
        except FrameError as exc:
            exc.identity = identity  # so a listener can answer the bad peer
            raise

    def _recv_frames(self, identity: Optional[bytes], destination: Optional[Callable[[Header], Any]]) -> Message:
        first = self.socket.recv(copy=False)
        try:
            header = decode_header(first.buffer, self.max_payload_bytes)
        except FrameError:
            self._drain()
            raise
        payload = None
        received = len(first.buffer)
        if first.more:
            target = destination(header) if destination is not None else None
            if target is not None:
                nbytes = self.socket.recv_into(target)
                if nbytes != header.payload_bytes or nbytes > memoryview(target).nbytes:
                    self._drain()
                    raise FrameError(
                        f"payload of {nbytes} bytes for key {header.key}, header announced "
                        f"{header.payload_bytes} and the destination holds {memoryview(target).nbytes}"
                    )
            else:
                payload = self.socket.recv(copy=False)
                nbytes = len(payload.buffer)
            received += nbytes
            if self.socket.get(zmq.RCVMORE):
                self._drain()
                raise FrameError("message has more than one payload frame")
            if nbytes != header.payload_bytes:
                raise FrameError(f"payload is {nbytes} bytes, header announced {header.payload_bytes}")
        elif header.payload_bytes:
            raise FrameError(f"header announced a {header.payload_bytes}-byte payload that is missing")
        self.counters.bytes_received += received
        self.counters.messages_received += 1
        return Message(header, payload, identity)

    def _drain(self) -> None:
        while self.socket.get(zmq.RCVMORE):
            self.socket.recv(copy=False)

    def close(self, linger_ms: Optional[int] = None) -> None:
        self.socket.close(linger=DEFAULT_LINGER_MS if linger_ms is None else linger_ms)


class Listener(Endpoint):
    """A bound ROUTER socket: the scheduler's and each server's front door."""

    routed = True

    def __init__(self, context: zmq.Context, host: str, port: int = 0, max_payload_bytes: int = 1 << 32):
        super().__init__(context, zmq.ROUTER, max_payload_bytes)
        self.host = host
        try:
            if port:
                self.socket.bind(tcp_address(host, port))
                self.port = port
            else:
                self.port = self.socket.bind_to_random_port(f"tcp://{host}")
        except zmq.ZMQError as exc:
            self.socket.close(linger=0)
            if exc.errno == zmq.EADDRINUSE:
                raise TransportError(f"cannot bind {tcp_address(host, port)}: port {port} is in use") from None
            raise TransportError(f"cannot bind tcp://{host}:{port or '*'}: {exc}") from None

    @property
    def address(self) -> str:
        return tcp_address(self.host, self.port)

    def recv_or_refuse(self, sender: int, log: logging.Logger) -> Optional[Message]:
        """Receive one message; a malformed one is logged, answered with an ERROR and None returned.

        This is how the scheduler and servers survive bad peers: the peer
        learns what was wrong, everyone else carries on.
        """
        try:
            return self.recv()
        except FrameError as exc:
            log.error("dropped a malformed message: %s", exc)
            identity = getattr(exc, "identity", None)
            if identity is not None:
                self.send(Command.ERROR, sender, payload=str(exc).encode(), identity=identity)
            return None


class Connection(Endpoint):
    """A DEALER socket connected to one listener."""

    def __init__(self, context: zmq.Context, host: str, port: int, max_payload_bytes: int = 1 << 32):
        super().__init__(context, zmq.DEALER, max_payload_bytes)
        self.address = tcp_address(host, port)
        try:
            self.socket.connect(self.address)
        except zmq.ZMQError as exc:
            self.socket.close(linger=0)
            raise TransportError(f"cannot connect to {self.address}: {exc}") from None
