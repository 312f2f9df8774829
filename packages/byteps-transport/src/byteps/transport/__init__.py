"""byteps-transport: the wire protocol, the endpoint interface and its transports, rendezvous.

The bottom layer of byteps; it depends on no other byteps package. Nodes
exchange framed messages (a validated 40-byte header plus an optional
payload) through :class:`Endpoint`s, chosen by address scheme from a
:class:`Context` (ZeroMQ ``tcp://`` between machines, ``ipc://@name``
inside one), and wait on them with a :class:`Poller`. The scheduler
assembles the job's address book. A new transport (shared memory, RDMA via
pyverbs) implements the endpoint's protected surface and registers its
scheme (:func:`register_transport`); nothing above this package changes.
"""

from byteps.transport.authentication import AuthenticationError, ClientHandshake, Gate, authenticate
from byteps.transport.context import Context, RdmaSettings, register_transport, transport_schemes
from byteps.transport.endpoint import ByteCounters, Endpoint, Message
from byteps.transport.errors import NodeFailure, RemoteError, RendezvousTimeout, TransportError
from byteps.transport.frames import (
    FLAG_AVERAGE,
    FLAG_BARE,
    FLAG_LOOKUP,
    FLAG_PULL,
    FLAG_SKIPPED,
    FLAG_ZEROS,
    HEADER_BYTES,
    PROTOCOL_VERSION,
    Command,
    FrameError,
    Header,
    ProtocolVersionError,
    command_name,
    json_payload,
    parse_json_payload,
)
from byteps.transport.poller import Poller
from byteps.transport.rendezvous import AddressBook, ClockEstimate, NodeInfo, SchedulerClient
from byteps.transport.scheduler import Scheduler, SchedulerOptions
from byteps.transport.verbs import RdmaUnavailable
from byteps.transport.zmq_endpoints import Connection, Listener, tcp_address

# 2.0: the endpoint interface (Endpoint with a protected transport surface,
# Context.listen/connect by address scheme, Poller), payloads as memoryviews,
# ClientHandshake; 1.1: PUSH_ACK, LOCAL_READY/LOCAL_DONE, AddressBook.job_id
# 2.1: NodeInfo.settings (job-wide settings checked at rendezvous), FLAG_SKIPPED
# 2.2: FLAG_ZEROS; 2.3: FLAG_BARE; 2.4: SchedulerOptions.lost_node_file
# 2.5: Context(shared_memory=...), payloads through shared memory on one host
# 2.6: Context(rdma=RdmaSettings(...)): payloads by RDMA WRITE; ByteCounters.rdma_*
# 2.7: FLAG_PULL, wire protocol v3 (a PUSH that is also its PULL); 2.8: zero-copy RDMA sends, no inline writes
# 2.9: SchedulerOptions.shutdown_leaves, AddressBook.shutdown_leaves
# 2.10: wire protocol v4, BARRIER_ARRIVED for a BARRIER sent with BARRIER_ASK_ARRIVAL
# 2.11: wire protocol v5 (a row-sparse round is one push per machine, its ranks' rows summed there), Message.text
# 2.12: wire protocol v6, FLAG_LOOKUP (rows of a server-held table looked up by id)
INTERFACE_VERSION = (2, 12)

__all__ = [
    "INTERFACE_VERSION",
    "PROTOCOL_VERSION",
    "HEADER_BYTES",
    "FLAG_AVERAGE",
    "FLAG_SKIPPED",
    "FLAG_ZEROS",
    "FLAG_BARE",
    "FLAG_LOOKUP",
    "FLAG_PULL",
    "AddressBook",
    "AuthenticationError",
    "ByteCounters",
    "ClientHandshake",
    "ClockEstimate",
    "Command",
    "Connection",
    "Context",
    "Endpoint",
    "FrameError",
    "Gate",
    "Header",
    "Listener",
    "Message",
    "NodeFailure",
    "NodeInfo",
    "Poller",
    "ProtocolVersionError",
    "RdmaSettings",
    "RdmaUnavailable",
    "RemoteError",
    "RendezvousTimeout",
    "Scheduler",
    "SchedulerClient",
    "SchedulerOptions",
    "TransportError",
    "authenticate",
    "command_name",
    "json_payload",
    "parse_json_payload",
    "register_transport",
    "tcp_address",
    "transport_schemes",
]
