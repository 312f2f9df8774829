"""A process's transports, chosen by address scheme.

Code above the transport layer names addresses, never sockets::

    context = Context()
    inbox = context.listen("ipc://@byteps-job-m0-l1")
    server = context.connect("tcp://10.0.0.2:9000", max_payload_bytes=1 << 20)
    ...
    context.close()

ZeroMQ serves ``tcp://`` and ``ipc://``. Between processes of one host, a
``tcp://`` endpoint moves large payloads through shared memory instead
(:mod:`byteps.transport.co_located`) when its context allows it
(``Context(shared_memory=True)``). With ``Context(rdma=RdmaSettings(...))``
(``DMLC_ENABLE_RDMA=1``), ``tcp://`` endpoints move large payloads by RDMA
WRITE instead (:mod:`byteps.transport.rdma_endpoints`); the RDMA device is
opened when the context is made, so a machine without one fails at once. A
new transport registers its scheme with :func:`register_transport` and is
then used by every layer above without a change there.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, Dict, Optional, Tuple

import zmq

from byteps.transport.co_located import SharedConnection, SharedListener
from byteps.transport.endpoint import Endpoint
from byteps.transport.errors import TransportError
from byteps.transport.rdma_endpoints import RdmaConnection, RdmaListener
from byteps.transport.verbs import Device, open_device
from byteps.transport.zmq_endpoints import ZmqConnection, ZmqListener

__all__ = ["Context", "RdmaSettings", "register_transport", "transport_schemes"]

# scheme -> (make a listener, make a connection); each takes (context, address, max_payload_bytes)
Factory = Callable[["Context", str, int], Endpoint]
_TRANSPORTS: Dict[str, Tuple[Factory, Factory]] = {
    "tcp": (SharedListener, SharedConnection),
    "ipc": (ZmqListener, ZmqConnection),
}
_lock = threading.Lock()


def register_transport(scheme: str, listen: Factory, connect: Factory) -> None:
    """Serve addresses ``<scheme>://...`` with these endpoint factories."""
    with _lock:
        _TRANSPORTS[scheme] = (listen, connect)


def transport_schemes() -> Tuple[str, ...]:
    return tuple(sorted(_TRANSPORTS))


def _factories(address: str) -> Tuple[Factory, Factory]:
    scheme = address.partition("://")[0]
    try:
        return _TRANSPORTS[scheme]
    except KeyError:
        raise TransportError(f"no transport for address {address!r}: known schemes are "
                             f"{', '.join(transport_schemes())}") from None


@dataclasses.dataclass(frozen=True)
class RdmaSettings:
    """Where RDMA runs: the RDMA NIC's network interface (DMLC_INTERFACE; None: the first device) and the
    GID index of its port (BYTEPS_RDMA_GID_INDEX)."""

    interface: Optional[str] = None
    gid_index: int = 0


class Context:
    """The transports' shared state in one process (ZeroMQ's I/O threads, the RDMA device)."""

    _shared: Context | None = None

    def __init__(self, zmq_context: Any = None, shared_memory: bool = False,
                 rdma: Optional[RdmaSettings] = None) -> None:
        #: RDMA: ``tcp://`` endpoints write large payloads (rdma_endpoints.py); raises RdmaUnavailable here
        self._rdma_device: Optional[Device] = open_device(rdma.interface, rdma.gid_index) if rdma else None
        self.zmq: Any = zmq_context if zmq_context is not None else zmq.Context()
        #: send large payloads to listeners on this host through shared memory (co_located.py)
        self.shared_memory = shared_memory and rdma is None
        self.rdma = rdma

    def rdma_device(self) -> Device:
        if self._rdma_device is None:
            raise TransportError("this context was made without RDMA (Context(rdma=RdmaSettings()))")
        return self._rdma_device

    @classmethod
    def shared(cls) -> Context:
        """One process-wide context that is never closed (for long-lived roles such as the scheduler)."""
        with _lock:
            if cls._shared is None:
                cls._shared = cls(zmq.Context.instance())
            return cls._shared

    def listen(self, address: str, max_payload_bytes: int = 1 << 32) -> Endpoint:
        """A listener bound at ``address`` (``tcp://host:0`` picks a free port)."""
        factory = RdmaListener if self.rdma and address.startswith("tcp://") else _factories(address)[0]
        return factory(self, address, max_payload_bytes)

    def connect(self, address: str, max_payload_bytes: int = 1 << 32) -> Endpoint:
        """A connection to the listener at ``address``."""
        factory = RdmaConnection if self.rdma and address.startswith("tcp://") else _factories(address)[1]
        return factory(self, address, max_payload_bytes)

    def close(self) -> None:
        """End the context; every endpoint must be closed first."""
        self.zmq.term()
        if self._rdma_device is not None:
            self._rdma_device.close()
            self._rdma_device = None
