"""Waiting on many endpoints at once, whatever their transport.

The thread that owns a set of endpoints (a worker's comm thread, a server's
loop) registers them, and any plain file descriptor such as a wake-up pipe,
and asks which are readable. Each endpoint names what to wait on through
``poll_target()``: a ZeroMQ socket, or a file descriptor for transports
that have one (shared memory signalled through an eventfd, an RDMA
completion channel).

Example::

    poller = Poller()
    poller.register(listener)
    poller.register(wake_fd)
    for ready in poller.poll(timeout_s=1.0):
        ...   # ready is the endpoint (or the fd) that was registered
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Union

import zmq

from byteps.transport.endpoint import Endpoint

__all__ = ["Poller"]


class Poller:
    """Readability of registered endpoints and file descriptors."""

    def __init__(self) -> None:
        self._poller = zmq.Poller()
        self._owners: Dict[Any, Union[Endpoint, int]] = {}

    def register(self, item: Union[Endpoint, int]) -> None:
        target = item if isinstance(item, int) else item.poll_target()
        self._poller.register(target, zmq.POLLIN)
        self._owners[target] = item

    def unregister(self, item: Union[Endpoint, int]) -> None:
        target = item if isinstance(item, int) else item.poll_target()
        self._poller.unregister(target)
        del self._owners[target]

    def poll(self, timeout_s: Optional[float] = None) -> List[Union[Endpoint, int]]:
        """The registered items that are readable, waiting at most ``timeout_s`` (None: forever)."""
        timeout_ms = None if timeout_s is None else max(1, int(timeout_s * 1000))
        return [self._owners[target] for target, _ in self._poller.poll(timeout_ms)]
