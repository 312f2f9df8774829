"""The ZeroMQ transport: TCP between machines, abstract Unix sockets inside one.

A listener is a bound ROUTER (scheduler, server, a local rank's inbox); a
connection is a DEALER connected to one listener. Payloads are sent with
``copy=False``: ZeroMQ reads large tensor buffers in place, Python never
copies them; a received payload is a memoryview of ZeroMQ's own message,
kept alive by the view.

Addresses: ``tcp://host:port`` (port 0 to a listener: any free port) and
``ipc://@name`` (Linux's abstract namespace: nothing on disk to clean up).
"""

from __future__ import annotations

from typing import Any, List, Optional, Union

import zmq

from byteps.transport.endpoint import Endpoint, frames_of
from byteps.transport.errors import TransportError

__all__ = ["ZmqListener", "ZmqConnection", "Listener", "Connection", "tcp_address", "zmq_context"]

DEFAULT_LINGER_MS = 2000
_SNDMORE = int(zmq.SNDMORE)  # a plain int: enum flags cost a Python call per frame


def tcp_address(host: str, port: int) -> str:
    return f"tcp://{host}:{port}"


def zmq_context(context: Any) -> zmq.Context:
    """The ZeroMQ context behind a :class:`~byteps.transport.context.Context` (or a zmq.Context itself)."""
    return context if isinstance(context, zmq.Context) else context.zmq


class _ZmqEndpoint(Endpoint):
    """The protected surface of :class:`Endpoint` over one ZeroMQ socket."""

    def __init__(self, context: Any, socket_type: int, max_payload_bytes: int) -> None:
        super().__init__(max_payload_bytes)
        self.socket = zmq_context(context).socket(socket_type)
        # Unlimited queues: a ROUTER silently drops at its high-water mark,
        # and a blocked DEALER could deadlock the worker's comm loop.
        self.socket.setsockopt(zmq.SNDHWM, 0)
        self.socket.setsockopt(zmq.RCVHWM, 0)
        self.socket.setsockopt(zmq.LINGER, DEFAULT_LINGER_MS)

    def _send_frames(self, identity: Optional[bytes], header: bytes, payload: Any) -> None:
        self._send_parts(frames_of(identity, header, payload))

    def _send_parts(self, frames: List[Any]) -> None:
        """One multipart message, each frame sent in place with plain int flags.

        The same bytes as ``send_multipart(frames, copy=False)`` without its
        per-frame enum arithmetic and type checks, about 2 µs less a message
        (benchmarks/bench_message_cost.py). The frames are a header, a
        payload already measured by ``payload_nbytes`` and small bytes
        (identity, marker, reference, RDMA handshake), so none can fail its
        type after an earlier one has gone.
        """
        send, last = self.socket.send, len(frames) - 1
        for frame in frames[:last]:
            send(frame, _SNDMORE, copy=False)
        send(frames[last], 0, copy=False)

    def _recv_identity(self) -> bytes:
        return self.socket.recv()

    def _recv_first(self) -> memoryview:
        self._last = self.socket.recv(copy=False)
        return self._last.buffer

    def _recv_payload(self) -> memoryview:
        self._last = self.socket.recv(copy=False)
        return self._last.buffer

    def _recv_payload_into(self, target: Any) -> int:
        nbytes = self.socket.recv_into(target)
        self._last = None
        return nbytes

    def _has_more(self) -> bool:
        if self._last is None:
            return bool(self.socket.get(zmq.RCVMORE))
        return self._last.more

    def _drain(self) -> None:
        while self.socket.get(zmq.RCVMORE):
            self.socket.recv(copy=False)

    def _wait(self, timeout_ms: Optional[int]) -> bool:
        return bool(self.socket.poll(timeout_ms))

    def poll_target(self) -> zmq.Socket:
        return self.socket

    def _close(self, linger_ms: Optional[int]) -> None:
        self.socket.close(linger=DEFAULT_LINGER_MS if linger_ms is None else linger_ms)

    _last: Optional[zmq.Frame] = None


class ZmqListener(_ZmqEndpoint):
    """A bound ROUTER socket at ``tcp://host:port`` or ``ipc://@name``."""

    routed = True

    def __init__(self, context: Any, address: str, max_payload_bytes: int = 1 << 32) -> None:
        super().__init__(context, zmq.ROUTER, max_payload_bytes)
        scheme, _, rest = address.partition("://")
        try:
            if scheme == "tcp" and rest.endswith(":0"):
                host = rest[:-2]
                self.port = self.socket.bind_to_random_port(f"tcp://{host}")
                self.host, address = host, tcp_address(host, self.port)
            else:
                self.socket.bind(address)
                if scheme == "tcp":
                    host, _, port = rest.rpartition(":")
                    self.host, self.port = host, int(port)
        except zmq.ZMQError as exc:
            self.socket.close(linger=0)
            if exc.errno == zmq.EADDRINUSE:
                what = f"port {rest.rpartition(':')[2]}" if scheme == "tcp" else "the address"
                raise TransportError(f"cannot bind {address}: {what} is in use") from None
            raise TransportError(f"cannot bind {address}: {exc}") from None
        self.address = address


class ZmqConnection(_ZmqEndpoint):
    """A DEALER socket connected to one listener."""

    def __init__(self, context: Any, address: str, max_payload_bytes: int = 1 << 32) -> None:
        super().__init__(context, zmq.DEALER, max_payload_bytes)
        self.address = address
        try:
            self.socket.connect(address)
        except zmq.ZMQError as exc:
            self.socket.close(linger=0)
            raise TransportError(f"cannot connect to {address}: {exc}") from None


class Listener(ZmqListener):
    """A TCP listener on ``host``, at ``port`` or (0) any free port."""

    def __init__(self, context: Any, host: str, port: int = 0, max_payload_bytes: int = 1 << 32) -> None:
        super().__init__(context, tcp_address(host, port), max_payload_bytes)


class Connection(ZmqConnection):
    """A TCP connection to the listener at ``host:port``."""

    def __init__(self, context: Any, host: str, port: Union[int, str], max_payload_bytes: int = 1 << 32) -> None:
        super().__init__(context, tcp_address(host, int(port)), max_payload_bytes)
