"""Who may talk to a job: mutual HMAC challenge-response on the job secret.

When a job has a secret (BYTEPS_JOB_SECRET; bpslaunch makes one per job),
every connection to the scheduler or a server proves it before anything else
is accepted, and the listener proves it back. The secret never crosses the
wire, only HMAC-SHA256 values over fresh random nonces:

    client -> HELLO      client_nonce
    server -> CHALLENGE  server_nonce, HMAC(secret, "server" | client_nonce | server_nonce)
    client -> PROOF      HMAC(secret, "client" | server_nonce | client_nonce)
    server -> AUTH_OK

A peer that skips or fails the exchange is answered with an ERROR, logged,
and none of its messages is acted upon.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import logging
import os
import time
from typing import Optional

from byteps.transport.endpoint import Endpoint, Message
from byteps.transport.errors import TransportError
from byteps.transport.frames import Command

__all__ = ["AuthenticationError", "ClientHandshake", "authenticate", "Gate"]

NONCE_BYTES = 16
MAC_BYTES = 32
_MAX_PENDING = 1024  # handshakes in progress a listener remembers (bounded against floods)


class AuthenticationError(TransportError):
    """The peer does not know this job's secret, or refused ours."""


def _mac(secret: bytes, label: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(secret, label + first + second, hashlib.sha256).digest()


class ClientHandshake:
    """The connecting side of the exchange, one message at a time.

    For an owner that cannot block (a thread that must keep serving its own
    listener meanwhile, as local ranks do while they authenticate to each
    other): :meth:`start` sends HELLO, and :meth:`step` takes each message
    the connection receives until it returns True (admitted). Errors raise
    :class:`AuthenticationError`.
    """

    def __init__(self, connection: Endpoint, secret: bytes, sender: int) -> None:
        self.connection, self.secret, self.sender = connection, secret, sender
        self._client_nonce = os.urandom(NONCE_BYTES)
        self._expected = Command.CHALLENGE
        self.done = False

    def start(self) -> None:
        self.connection.send(Command.HELLO, self.sender, payload=self._client_nonce)

    def step(self, message: Message) -> bool:
        address = self.connection.address
        command = message.header.command
        payload = bytes(message.payload) if message.payload is not None else b""
        if command == Command.ERROR:
            raise AuthenticationError(f"{address} refused this node: {payload.decode(errors='replace')}")
        if command != self._expected:
            raise AuthenticationError(f"{address} answered the handshake with command {command}")
        if command == Command.CHALLENGE:
            server_nonce, server_mac = payload[:NONCE_BYTES], payload[NONCE_BYTES:]
            if len(payload) != NONCE_BYTES + MAC_BYTES or not hmac.compare_digest(
                    server_mac, _mac(self.secret, b"server", self._client_nonce, server_nonce)):
                raise AuthenticationError(f"{address} does not know this job's secret "
                                          "(BYTEPS_JOB_SECRET differs): refusing to talk to it")
            self.connection.send(Command.PROOF, self.sender,
                                 payload=_mac(self.secret, b"client", server_nonce, self._client_nonce))
            self._expected = Command.AUTH_OK
            return False
        self.done = True
        return True


def authenticate(connection: Endpoint, secret: bytes, sender: int, timeout_s: float) -> None:
    """Prove the job secret to the listener behind ``connection`` and check its proof (blocking)."""
    deadline = time.monotonic() + timeout_s
    handshake = ClientHandshake(connection, secret, sender)
    handshake.start()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not connection.wait_readable(remaining):
            raise AuthenticationError(f"no answer from {connection.address} during authentication")
        if handshake.step(connection.recv()):
            return


class Gate:
    """A listener's door: lets through messages of peers that proved the secret.

    Without a secret every message passes. ``admit`` answers handshake
    messages itself and returns False for them and for anything from a peer
    that has not authenticated.
    """

    def __init__(self, secret: Optional[bytes], sender: int, log: logging.Logger) -> None:
        self.secret = secret
        self.sender = sender
        self.log = log
        self._admitted: set = set()
        self._pending: collections.OrderedDict[bytes, tuple] = collections.OrderedDict()

    @property
    def admitted(self) -> int:
        """How many peers have proved the secret so far."""
        return len(self._admitted)

    def admit(self, endpoint: Endpoint, message: Message) -> bool:
        if self.secret is None or message.identity in self._admitted:
            return True
        command, identity = message.header.command, message.identity
        payload = bytes(message.payload) if message.payload is not None else b""
        if command == Command.HELLO and len(payload) == NONCE_BYTES:
            server_nonce = os.urandom(NONCE_BYTES)
            self._pending[identity] = (payload, server_nonce)
            while len(self._pending) > _MAX_PENDING:
                self._pending.popitem(last=False)
            endpoint.send(Command.CHALLENGE, self.sender, identity=identity,
                          payload=server_nonce + _mac(self.secret, b"server", payload, server_nonce))
            return False
        if command == Command.PROOF and identity in self._pending:
            client_nonce, server_nonce = self._pending.pop(identity)
            if hmac.compare_digest(payload, _mac(self.secret, b"client", server_nonce, client_nonce)):
                self._admitted.add(identity)
                endpoint.send(Command.AUTH_OK, self.sender, identity=identity)
                return False
            self._refuse(endpoint, identity, "wrong proof of the job secret (BYTEPS_JOB_SECRET differs)")
            return False
        self._refuse(endpoint, identity, "not authenticated: this job requires its secret (BYTEPS_JOB_SECRET)")
        return False

    def _refuse(self, endpoint: Endpoint, identity: bytes, text: str) -> None:
        self.log.error("refused a peer: %s", text)
        endpoint.send(Command.ERROR, self.sender, payload=text.encode(), identity=identity)
