"""Picking a free TCP port for the embedded-mode scheduler.

The port is found by binding port 0 on the loopback address and closing the
socket; the scheduler binds it a moment later. Another process could take it
in between, which on a developer machine is rare enough that a retry of the
job is the right answer rather than a port-passing protocol.
"""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now.

    Example::

        port = free_port()   # e.g. 41237
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
