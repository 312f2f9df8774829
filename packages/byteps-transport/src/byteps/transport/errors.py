"""Errors raised by the transport layer."""

from __future__ import annotations

__all__ = ["TransportError", "RemoteError", "RendezvousTimeout", "NodeFailure"]


class TransportError(RuntimeError):
    """A connection, bind or protocol failure."""


class RemoteError(TransportError):
    """A peer answered with an ERROR message; the text is the peer's."""

    def __init__(self, peer: str, text: str, key: int = 0) -> None:
        super().__init__(f"{peer}: {text}")
        self.peer = peer
        self.text = text
        self.key = key


class RendezvousTimeout(TransportError):
    """The scheduler did not answer in time."""


class NodeFailure(TransportError):
    """A node of the job is dead (it stopped heartbeating), or the scheduler is."""
