"""The node side of rendezvous: register with the scheduler, barrier, finalize.

Every server and worker process opens one :class:`SchedulerClient`,
registers its :class:`NodeInfo` and receives the job's
:class:`AddressBook` once every expected node has registered (ps-lite's
ADD_NODE exchange). Afterwards it can barrier with the other workers, and a
worker tells the scheduler when it is done (finalize), which is how servers
learn to exit.

While it waits for the address book a node says, every few seconds on the
job log, what it waits for: the scheduler itself (no answer yet: check
DMLC_PS_ROOT_URI/DMLC_PS_ROOT_PORT) or the nodes that have not registered
(the scheduler tells, in its answer to the node's heartbeat). A timeout of
None waits as long as it takes (servers and the scheduler in role mode);
workers give up after BYTEPS_RENDEZVOUS_TIMEOUT.

Example::

    client = SchedulerClient(context, "127.0.0.1", 9000, timeout_s=60)
    book = client.register(NodeInfo(role="worker", worker_id=0, local_rank=0, local_size=1))
    print(book.rank, book.servers)
"""

from __future__ import annotations

import dataclasses
import os
import struct
import time
from typing import Any, Dict, Optional, Tuple

from byteps.transport.authentication import ClientHandshake
from byteps.transport.endpoint import Message
from byteps.transport.errors import NodeFailure, RemoteError, RendezvousTimeout, TransportError
from byteps.transport.frames import MAX_CONTROL_PAYLOAD, Command, command_name, json_payload, parse_json_payload
from byteps.transport.job_log import WaitReporter, job_log
from byteps.transport.zmq_endpoints import Connection

__all__ = ["NodeInfo", "AddressBook", "SchedulerClient", "ClockEstimate", "BARRIER_WORKERS", "BARRIER_ALL",
           "BARRIER_ASK_ARRIVAL", "CLOCK"]

BARRIER_WORKERS = 1
BARRIER_ALL = 2
# A BARRIER whose round is this asks the scheduler to answer BARRIER_ARRIVED once it counted the arrival (before
# any release): hvd.join() lets its zeros count only after that, so the rank it releases with is the causal last.
BARRIER_ASK_ARRIVAL = 1
#: After the address book, the scheduler answers a heartbeat with its wall clock (a float64 of time.time()).
CLOCK = struct.Struct("<d")


@dataclasses.dataclass
class ClockEstimate:
    """This node's wall clock against the scheduler's, from heartbeat round trips (NTP's idea, simplified).

    A heartbeat sent at local time ``t0`` is answered with the scheduler's
    time ``s`` and received at ``t1``: the offset (scheduler minus local)
    is ``s - (t0 + t1)/2``, within ``(t1 - t0)/2``. The estimate of the
    shortest round trip so far is kept; ``offset_s`` is None until one came.
    """

    offset_s: Optional[float] = None
    error_s: float = float("inf")

    def add(self, sent: float, scheduler: float, received: float) -> None:
        error = (received - sent) / 2
        if 0 <= error < self.error_s:
            self.offset_s, self.error_s = scheduler - (sent + received) / 2, error


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    """What a node tells the scheduler about itself."""

    role: str  # "worker" or "server"
    host: str = ""
    port: int = 0  # a server's listening port
    worker_id: int = 0
    local_rank: int = 0
    local_size: int = 1
    pid: int = dataclasses.field(default_factory=os.getpid)
    # Job-wide settings every node must share, as {variable: value} (Config.job_settings()): the scheduler
    # refuses a node whose settings differ from the first node's, naming the variable.
    settings: Dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def short_name(self) -> str:
        """``server``, ``worker 1``, ``worker 1 local rank 0``: who waits, in a job-log line."""
        if self.role != "worker":
            return self.role
        return f"worker {self.worker_id}" + (f" local rank {self.local_rank}" if self.local_size > 1 else "")

    def describe(self) -> str:
        if self.role == "server":
            return f"server at {self.host}:{self.port} (pid {self.pid})"
        where = f" on {self.host}" if self.host else ""
        return f"worker {self.worker_id} local rank {self.local_rank}{where} (pid {self.pid})"


@dataclasses.dataclass(frozen=True)
class AddressBook:
    """The job as the scheduler assembled it, identical on every node."""

    servers: Tuple[Tuple[str, int], ...]
    num_worker_machines: int
    local_size: int
    rank: int  # this node's rank among its role (worker rank or server rank)
    job_id: str = ""  # the same on every node: names shared memory and local sockets
    #: A worker's shutdown() leaves the job (BytePS), rather than suspending it for a later init() (Horovod).
    shutdown_leaves: bool = False

    @property
    def num_workers(self) -> int:
        """Worker processes in the job (each pushes every partition)."""
        return self.num_worker_machines * self.local_size

    def to_json(self) -> dict:
        return {
            "servers": [list(s) for s in self.servers],
            "num_worker_machines": self.num_worker_machines,
            "local_size": self.local_size,
            "rank": self.rank,
            "job_id": self.job_id,
            "shutdown_leaves": self.shutdown_leaves,
        }

    @classmethod
    def from_json(cls, obj: dict) -> AddressBook:
        return cls(
            servers=tuple((str(h), int(p)) for h, p in obj["servers"]),
            num_worker_machines=int(obj["num_worker_machines"]),
            local_size=int(obj["local_size"]),
            rank=int(obj["rank"]),
            job_id=str(obj.get("job_id", "")),
            shutdown_leaves=bool(obj.get("shutdown_leaves", False)),
        )


class SchedulerClient:
    """A node's connection to the scheduler, and its heartbeat.

    After registration, the thread that owns the client calls ``pulse()``
    regularly (its return value is how long it may sleep, e.g. in a poll):
    it sends a heartbeat every ``heartbeat_interval_s`` and raises
    :class:`NodeFailure` when the scheduler has been silent for
    ``heartbeat_timeout_s``. ``recv()`` raises NodeFailure when the scheduler
    reports another node dead. An interval of 0 turns heartbeats off.
    """

    def __init__(self, context: Any, host: str, port: int, timeout_s: Optional[float],
                 heartbeat_interval_s: float = 1.0, heartbeat_timeout_s: float = 10.0,
                 secret: Optional[bytes] = None) -> None:
        self.connection = Connection(context, host, port, max_payload_bytes=MAX_CONTROL_PAYLOAD)
        self.timeout_s = timeout_s
        self.secret = secret
        self.heartbeat_interval_s = heartbeat_interval_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.rank = -1
        self._last_heard = time.monotonic()
        self._last_beat = 0.0
        self._beat_sent_wall = 0.0  # time.time() of the last heartbeat, for the clock estimate
        self.clock = ClockEstimate()

    def pulse(self) -> Optional[float]:
        """Heartbeat if due; NodeFailure if the scheduler is silent; seconds until the next beat."""
        if self.heartbeat_interval_s <= 0:
            return None
        now = time.monotonic()
        silent = now - self._last_heard
        if silent > self.heartbeat_timeout_s:
            raise NodeFailure(
                f"the scheduler at {self.address} has not answered for {silent:.1f} s "
                f"(PS_HEARTBEAT_TIMEOUT={self.heartbeat_timeout_s:g}): presumed dead")
        if now - self._last_beat >= self.heartbeat_interval_s:
            self._beat_sent_wall = time.time()
            self.connection.send(Command.HEARTBEAT, self.rank)
            self._last_beat = now
        return max(0.0, self._last_beat + self.heartbeat_interval_s - now)

    @property
    def address(self) -> str:
        return self.connection.address

    def register(self, info: NodeInfo) -> AddressBook:
        """Announce this node (proving the job secret first, if any) and wait for the address book.

        Raises RendezvousTimeout after ``timeout_s`` (None: never), naming
        what was missing: the scheduler itself, or the nodes not registered.
        """
        waiting = _Rendezvous(self, info)
        if self.secret is not None:
            handshake = ClientHandshake(self.connection, self.secret, -1)
            handshake.start()
            while not handshake.step(waiting.next_message(raw=True)):
                pass
        self.connection.send(Command.REGISTER, -1, payload=json_payload(dataclasses.asdict(info)))
        waiting.registered = True
        while True:
            reply = waiting.next_message()
            if reply.header.command == Command.ADDRESS_BOOK:
                break
            if reply.header.command == Command.HEARTBEAT:
                waiting.note_status(reply)
                continue
            raise TransportError(
                f"unexpected {command_name(reply.header.command)} from the scheduler during registration")
        book = AddressBook.from_json(parse_json_payload(reply.payload))
        self.rank = book.rank
        return book

    def barrier(self, group: int = BARRIER_WORKERS) -> None:
        """Block until every node of ``group`` has entered the barrier."""
        self.connection.send(Command.BARRIER, self.rank, aux=group)
        self._expect(Command.BARRIER_RELEASE, "a barrier")

    def finalize(self) -> None:
        """Tell the scheduler this worker is done.

        It does not wait for the other workers: a worker that fails and exits
        must not block in its exit handler until the healthy ones finish.
        The servers stop once every worker has finalized.
        """
        self.connection.send(Command.FINALIZE, self.rank)

    def recv(self) -> Message:
        """Receive one message; ERROR raises RemoteError, NODE_FAILED raises NodeFailure."""
        message = self.connection.recv()
        self._last_heard = time.monotonic()
        if (message.header.command == Command.HEARTBEAT and self.rank >= 0 and self._beat_sent_wall
                and message.payload is not None and len(message.payload) == CLOCK.size):
            self.clock.add(self._beat_sent_wall, CLOCK.unpack(message.payload)[0], time.time())
        if message.header.command == Command.ERROR:
            raise RemoteError(f"scheduler {self.address}", message.text())
        if message.header.command == Command.NODE_FAILED:
            raise NodeFailure(f"the job lost a node: {message.text()}")
        return message

    def _expect(self, command: Command, what: str) -> Message:
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if (remaining is not None and remaining <= 0) or not self.connection.wait_readable(remaining):
                raise RendezvousTimeout(
                    f"no answer from the scheduler at {self.address} during {what} within "
                    f"{self.timeout_s:g} s (BYTEPS_RENDEZVOUS_TIMEOUT): check DMLC_PS_ROOT_URI/DMLC_PS_ROOT_PORT "
                    "and that the scheduler and every other node of the job are running"
                )
            message = self.recv()
            if message.header.command == command:
                return message
            if message.header.command == Command.HEARTBEAT:
                continue  # the answer to a heartbeat sent before this request
            raise TransportError(
                f"unexpected {command_name(message.header.command)} from the scheduler during {what}"
            )

    def close(self, linger_ms: Optional[int] = None) -> None:
        self.connection.close(linger_ms)


class _Rendezvous:
    """One registration's wait: paced reports of what is missing, and its timeout.

    A second before each report, a registered node asks the scheduler what
    it still waits for (a heartbeat, which the scheduler answers with the
    missing nodes); a rendezvous that completes quickly sends no such probe.
    """

    PROBE_LEAD_S = 1.0

    def __init__(self, client: SchedulerClient, info: NodeInfo) -> None:
        self.client = client
        self.who = info.short_name
        self.registered = False  # REGISTER sent (after the handshake, if any)
        self.answered = False  # the scheduler said something: it is up
        self.status = ""  # what the scheduler last said it waits for
        self.reporter = WaitReporter()
        self.probed = False  # asked for the status since the last report
        self.deadline = None if client.timeout_s is None else time.monotonic() + client.timeout_s

    def next_message(self, raw: bool = False) -> Message:
        """The scheduler's next message, reporting the wait every few seconds; RendezvousTimeout at the deadline.

        ``raw``: as received (the handshake reads ERROR itself); otherwise
        through :meth:`SchedulerClient.recv`, which raises on ERROR.
        """
        client = self.client
        while True:
            remaining = None if self.deadline is None else self.deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise RendezvousTimeout(self._timeout_text())
            # Sleep until the next report or the deadline, waking a little earlier to probe first.
            slice_s = self.reporter.until_due() if remaining is None else min(remaining, self.reporter.until_due())
            if self.registered and not self.probed:
                if slice_s <= self.PROBE_LEAD_S:
                    client.connection.send(Command.HEARTBEAT, -1)
                    self.probed = True
                else:
                    slice_s -= self.PROBE_LEAD_S
            if client.connection.wait_readable(slice_s):
                self.answered = True
                return client.connection.recv() if raw else client.recv()
            if self.reporter.due():
                self._report()
                self.probed = False

    def note_status(self, message: Message) -> None:
        if message.payload is not None and len(message.payload):
            self.status = bytes(message.payload).decode(errors="replace")

    def _report(self) -> None:
        client = self.client
        limit = ("waiting as long as it takes" if client.timeout_s is None
                 else f"giving up after {client.timeout_s:g} s (BYTEPS_RENDEZVOUS_TIMEOUT)")
        if not self.answered:
            job_log.warning("%s waits for the scheduler at %s: no answer for %.0f s (is it running? "
                            "DMLC_PS_ROOT_URI/DMLC_PS_ROOT_PORT); %s",
                            self.who, client.address, self.reporter.waited_s, limit)
        else:
            job_log.warning("%s registered; the scheduler still waits for %s (%.0f s so far; %s)",
                            self.who, self.status or "other nodes", self.reporter.waited_s, limit)

    def _timeout_text(self) -> str:
        address, timeout = self.client.address, self.client.timeout_s
        if not self.answered:
            return (f"{self.who}: no answer from the scheduler at {address} within {timeout:g} s "
                    "(BYTEPS_RENDEZVOUS_TIMEOUT): is it running? check DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT")
        return (f"{self.who}: the job did not assemble within {timeout:g} s (BYTEPS_RENDEZVOUS_TIMEOUT); "
                f"the scheduler at {address} still waits for {self.status or 'other nodes'}")
