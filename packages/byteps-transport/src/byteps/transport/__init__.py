"""byteps-transport: the wire protocol, ZeroMQ endpoints and scheduler rendezvous.

The bottom layer of byteps; it depends on no other byteps package. Nodes
exchange framed messages (a validated 40-byte header plus an optional
payload) over ZeroMQ TCP sockets; the scheduler assembles the job's address
book. RDMA (pyverbs) is planned behind the same endpoint interface.
"""

from byteps.transport.authentication import AuthenticationError, Gate, authenticate
from byteps.transport.endpoints import ByteCounters, Connection, Endpoint, Listener, Message
from byteps.transport.errors import NodeFailure, RemoteError, RendezvousTimeout, TransportError
from byteps.transport.frames import (
    HEADER_BYTES,
    PROTOCOL_VERSION,
    Command,
    FrameError,
    Header,
    ProtocolVersionError,
)
from byteps.transport.rendezvous import AddressBook, NodeInfo, SchedulerClient
from byteps.transport.scheduler import Scheduler, SchedulerOptions

INTERFACE_VERSION = (1, 1)  # 1.1: PUSH_ACK, LOCAL_READY/LOCAL_DONE, AddressBook.job_id

__all__ = [
    "INTERFACE_VERSION",
    "PROTOCOL_VERSION",
    "HEADER_BYTES",
    "AddressBook",
    "AuthenticationError",
    "Gate",
    "authenticate",
    "ByteCounters",
    "Command",
    "Connection",
    "Endpoint",
    "FrameError",
    "Header",
    "Listener",
    "Message",
    "NodeFailure",
    "NodeInfo",
    "ProtocolVersionError",
    "RemoteError",
    "RendezvousTimeout",
    "Scheduler",
    "SchedulerClient",
    "SchedulerOptions",
    "TransportError",
]
