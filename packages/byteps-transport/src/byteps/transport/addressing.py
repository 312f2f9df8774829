"""Which local address a node binds and announces.

Order of precedence, as in ps-lite: an explicit host (DMLC_NODE_HOST), else
the IPv4 address of a named interface (DMLC_INTERFACE), else the local
address the kernel would use to reach the scheduler. Binding to one address
(never 0.0.0.0 unless asked) keeps a job off interfaces it was not given.
"""

from __future__ import annotations

import fcntl
import socket
import struct
from typing import Optional

from byteps.transport.errors import TransportError

__all__ = ["interface_address", "resolve_host"]

_SIOCGIFADDR = 0x8915


def interface_address(interface: str) -> str:
    """IPv4 address of a network interface, e.g. 'lo' -> '127.0.0.1'."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", interface.encode()[:15]))
        except OSError as exc:
            names = ", ".join(name for _, name in socket.if_nameindex())
            raise TransportError(
                f"interface {interface!r} has no IPv4 address ({exc.strerror}); interfaces here: {names}"
            ) from None
    return socket.inet_ntoa(packed[20:24])


def _route_toward(peer_host: str) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((peer_host, 9))  # UDP connect sends nothing; it only picks a route
        except OSError as exc:
            raise TransportError(f"no route to {peer_host}: {exc.strerror}") from None
        return probe.getsockname()[0]


def resolve_host(node_host: Optional[str], interface: Optional[str], toward: Optional[str]) -> str:
    """The address this node binds and announces to its peers."""
    if node_host:
        return node_host
    if interface:
        return interface_address(interface)
    if toward:
        return _route_toward(toward)
    return "127.0.0.1"
