"""A TCP port on 127.0.0.1 that nothing listens on, for a scheduler a test starts."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel just handed out on ``host`` and released again.

    Another process could take it before the test binds it; the kernel hands
    out ephemeral ports round-robin, so that is rare enough for tests.

    Example::

        env = {"DMLC_PS_ROOT_PORT": str(free_port())}
    """
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]
