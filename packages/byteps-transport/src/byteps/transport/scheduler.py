"""The scheduler: rendezvous, barriers and the end of a job.

One scheduler per job (ps-lite's scheduler node, at DMLC_PS_ROOT_URI:
DMLC_PS_ROOT_PORT). It waits until ``num_servers`` servers and
``num_worker_machines`` x ``local_size`` worker processes have registered,
sends each node the same address book, serves barriers, and when every
worker has finalized it tells the servers to exit. It waits for late nodes
as long as it takes, saying on the job log every few seconds (then every
30 s) which are missing, and answers a waiting node's heartbeat with the
same text so the node can say it too.
A malformed or foreign message is logged and answered with an ERROR; it
never stops the scheduler.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
import threading
import time
from typing import Any, Dict, List, Optional, Set

from byteps.transport.authentication import Gate
from byteps.transport.context import Context
from byteps.transport.endpoint import Message
from byteps.transport.errors import NodeFailure, TransportError
from byteps.transport.frames import (
    MAX_CONTROL_PAYLOAD,
    Command,
    FrameError,
    command_name,
    json_payload,
    parse_json_payload,
)
from byteps.transport.job_log import WaitReporter, job_log
from byteps.transport.rendezvous import (
    BARRIER_ALL,
    BARRIER_ASK_ARRIVAL,
    BARRIER_WORKERS,
    CLOCK,
    AddressBook,
    NodeInfo,
)
from byteps.transport.zmq_endpoints import Listener

__all__ = ["SchedulerOptions", "Scheduler"]

log = logging.getLogger("byteps.transport.scheduler")
SCHEDULER_SENDER = -1


@dataclasses.dataclass(frozen=True)
class SchedulerOptions:
    host: str
    port: int
    num_worker_machines: int
    num_servers: int
    heartbeat_timeout_s: float = 10.0  # 0: do not watch the nodes' heartbeats
    secret: Optional[bytes] = dataclasses.field(default=None, repr=False)  # the job secret, if any
    job_id: str = ""  # names the job's shared memory and local sockets; "" picks a random one
    #: Where to write, as JSON, the node presumed dead when one ends the job (a launcher that re-forms the
    #: job reads it: a hung process never exits, so only the scheduler can say which one it was).
    lost_node_file: Optional[str] = None
    #: Told to every node in the address book: a worker's shutdown() then leaves the job (BytePS's contract, role
    #: mode), so the job ends once every worker has; otherwise shutdown() suspends for a later init() (Horovod's).
    shutdown_leaves: bool = False


@dataclasses.dataclass
class _Registered:
    identity: bytes
    info: NodeInfo
    last_heard: float = 0.0
    finished: bool = False  # a finalized worker is no longer watched


#: After a settings mismatch the scheduler lingers this long (its errors reach the nodes), then exits non-zero.
_REFUSAL_GRACE_S = 1.0


class Scheduler:
    """Runs the rendezvous of one job; ``run()`` returns when the job is over."""

    def __init__(self, options: SchedulerOptions, context: Optional[Any] = None) -> None:
        self.options = options
        self.job_id = options.job_id or secrets.token_hex(6)
        self.context = context or Context.shared()
        self.listener = Listener(self.context, options.host, options.port, MAX_CONTROL_PAYLOAD)
        self.gate = Gate(options.secret, SCHEDULER_SENDER, log)
        self.servers: List[_Registered] = []
        self.workers: Dict[int, _Registered] = {}  # by rank
        self.local_size: Optional[int] = None
        self.settings_from: Optional[NodeInfo] = None  # the first node registered: its job-wide settings hold
        self.refusal: Optional[str] = None  # a settings mismatch: the job cannot assemble
        self._refused_at = 0.0
        self.book_sent = False
        self.barriers: Dict[int, Set[bytes]] = {BARRIER_WORKERS: set(), BARRIER_ALL: set()}
        self.finalized: Set[int] = set()
        self._stop = threading.Event()
        self._started = time.monotonic()

    @property
    def address(self) -> str:
        return self.listener.address

    def _expected_workers(self) -> Optional[int]:
        if self.local_size is None:
            return None
        return self.options.num_worker_machines * self.local_size

    def run(self) -> None:
        job_log.info("scheduler up on %s; waiting for %s", self.address, self._expected())
        reporter = WaitReporter()
        try:
            while not self._job_over() and not self._stop.is_set():
                if self.listener.wait_readable(0.5):
                    self._handle_one()
                if not self.book_sent and reporter.due():
                    job_log.warning("scheduler still waits for %s (%.0f s so far)", self._missing(),
                                    reporter.waited_s)
                self._check_heartbeats()
                if self.refusal is not None and time.monotonic() > self._refused_at + _REFUSAL_GRACE_S:
                    raise TransportError(self.refusal)  # every node was told; the job cannot assemble
        except (SystemExit, KeyboardInterrupt):
            # Stopped by a signal (a launcher's SIGTERM, e.g. bpslaunch ending a membership epoch): every node
            # still in the job hears it now rather than after PS_HEARTBEAT_TIMEOUT.
            self._tell_nodes("the scheduler at " + self.address + " was stopped before the job ended")
            raise
        finally:
            self.listener.close()

    def _tell_nodes(self, text: str, spare: Optional[_Registered] = None) -> None:
        """Send NODE_FAILED with ``text`` to every registered node still in the job (but ``spare``)."""
        for other in self._nodes():
            if other is not spare and not other.finished:
                self.listener.send(Command.NODE_FAILED, SCHEDULER_SENDER, payload=text.encode(),
                                   identity=other.identity)

    def stop(self) -> None:
        """Ask ``run()`` (in another thread) to return within a second; for embedding and tests."""
        self._stop.set()

    def _nodes(self) -> List[_Registered]:
        return self.servers + list(self.workers.values())

    def _check_heartbeats(self) -> None:
        """After rendezvous, a node silent for longer than the timeout is presumed dead: tell everyone, stop."""
        if not self.book_sent or self.options.heartbeat_timeout_s <= 0:
            return
        now = time.monotonic()
        for entry in self._nodes():
            silent = now - entry.last_heard
            if entry.finished or silent <= self.options.heartbeat_timeout_s:
                continue
            text = (f"{entry.info.describe()} sent no heartbeat for {silent:.1f} s "
                    f"(PS_HEARTBEAT_TIMEOUT={self.options.heartbeat_timeout_s:g}): presumed dead")
            log.error("%s; telling every other node and ending the job", text)
            self._write_lost_node(entry.info, text)  # before any node hears it and exits
            self._tell_nodes(text, spare=entry)
            raise NodeFailure(text)

    def _write_lost_node(self, info: NodeInfo, text: str) -> None:
        if not self.options.lost_node_file:
            return
        record = {"role": info.role, "worker_id": info.worker_id, "local_rank": info.local_rank, "host": info.host,
                  "pid": info.pid, "why": text}
        temporary = f"{self.options.lost_node_file}.{os.getpid()}"
        try:
            with open(temporary, "w") as out:
                json.dump(record, out)
            os.replace(temporary, self.options.lost_node_file)
        except OSError as exc:
            log.error("could not write the lost node to %s: %s", self.options.lost_node_file, exc)

    def _heard_from(self, identity: bytes) -> None:
        for entry in self._nodes():
            if entry.identity == identity:
                entry.last_heard = time.monotonic()
                return

    def _job_over(self) -> bool:
        expected = self._expected_workers()
        return expected is not None and len(self.finalized) == expected

    def _expected(self) -> str:
        machines = _count(self.options.num_worker_machines, "worker machine")
        return f"{_count(self.options.num_servers, 'server')} and {machines}" if self.options.num_servers else machines

    def _missing(self) -> str:
        """What the rendezvous still waits for, e.g. ``worker rank 1 (1/2 worker processes)``."""
        parts = []
        if len(self.servers) < self.options.num_servers:
            parts.append(f"{self.options.num_servers - len(self.servers)} more of "
                         f"{_count(self.options.num_servers, 'server')}")
        expected = self._expected_workers()
        if expected is None:
            parts.append(f"the {_count(self.options.num_worker_machines, 'worker machine')}")
        elif len(self.workers) < expected:
            missing = sorted(set(range(expected)) - set(self.workers))
            shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
            parts.append(f"worker rank{'s' if len(missing) > 1 else ''} {shown} "
                         f"({len(self.workers)}/{expected} worker processes registered)")
        return " and ".join(parts) or "nothing"

    def _handle_one(self) -> None:
        message = self.listener.recv_or_refuse(SCHEDULER_SENDER, log)
        if message is None or not self.gate.admit(self.listener, message):
            return
        command = message.header.command
        self._heard_from(message.identity)
        try:
            if command == Command.HEARTBEAT:
                # Before the address book, the answer tells a waiting node what the job still lacks;
                # after it, the scheduler's wall clock, from which nodes estimate their clock's offset.
                status = CLOCK.pack(time.time()) if self.book_sent else self._missing().encode()
                self.listener.send(Command.HEARTBEAT, SCHEDULER_SENDER, payload=status, identity=message.identity)
            elif command == Command.REGISTER:
                self._register(message)
            elif command == Command.BARRIER:
                self._barrier(message)
            elif command == Command.FINALIZE:
                self._finalize(message)
            else:
                raise TransportError(f"unexpected command {command_name(command)} at the scheduler")
        except (TransportError, FrameError, KeyError, TypeError, ValueError) as exc:
            log.error("refused a message from %r: %s", message.identity, exc)
            self._error(message.identity, str(exc))

    def _error(self, identity: bytes, text: str) -> None:
        self.listener.send(Command.ERROR, SCHEDULER_SENDER, payload=text.encode(), identity=identity)

    def _register(self, message: Message) -> None:
        if self.book_sent:
            raise TransportError("registration refused: the job's nodes have all registered already")
        if self.refusal is not None:
            raise TransportError(self.refusal)
        fields = parse_json_payload(message.payload if message.payload is not None else b"")
        info = NodeInfo(**fields)
        self._check_settings(info)
        entry = _Registered(message.identity, info)
        if info.role == "server":
            if len(self.servers) >= self.options.num_servers:
                raise TransportError(
                    f"registration refused: {info.describe()} is one server more than "
                    f"DMLC_NUM_SERVER={self.options.num_servers}")
            self.servers.append(entry)
        elif info.role == "worker":
            self._register_worker(entry)
        else:
            raise TransportError(f"registration refused: unknown role {info.role!r}")
        log.info("registered %s (still missing: %s)", info.describe(), self._missing())
        if len(self.servers) == self.options.num_servers and len(self.workers) == self._expected_workers():
            self._send_address_books()

    def _check_settings(self, info: NodeInfo) -> None:
        """Every node must share the job-wide settings (BYTEPS_ENABLE_ASYNC, ...) of the first that registered."""
        if self.settings_from is None:
            self.settings_from = info
            return
        first = self.settings_from.settings
        for variable in sorted(set(first) | set(info.settings)):
            mine, theirs = info.settings.get(variable, ""), first.get(variable, "")
            if mine != theirs:
                self._refused_at = time.monotonic()
                self.refusal = (
                    f"registration refused: {info.describe()} has {variable}={mine!r} but "
                    f"{self.settings_from.describe()} has {variable}={theirs!r}; every process of the job must "
                    "have the same value")
                for entry in self._nodes():  # the nodes already in wait for a job that cannot assemble
                    self._error(entry.identity, self.refusal)
                raise TransportError(self.refusal)

    def _register_worker(self, entry: _Registered) -> None:
        info = entry.info
        if self.local_size is None:
            self.local_size = info.local_size
        if info.local_size != self.local_size:
            raise TransportError(
                f"registration refused: {info.describe()} has BYTEPS_LOCAL_SIZE={info.local_size}, "
                f"other workers have {self.local_size}; every worker machine must run the same number")
        if not 0 <= info.worker_id < self.options.num_worker_machines:
            raise TransportError(
                f"registration refused: DMLC_WORKER_ID={info.worker_id} is outside "
                f"0..{self.options.num_worker_machines - 1} (DMLC_NUM_WORKER={self.options.num_worker_machines})")
        rank = info.worker_id * info.local_size + info.local_rank
        if rank in self.workers:
            raise TransportError(
                f"registration refused: {info.describe()} duplicates rank {rank} "
                f"already taken by {self.workers[rank].info.describe()}")
        self.workers[rank] = entry

    def _send_address_books(self) -> None:
        self.servers.sort(key=lambda s: (s.info.host, s.info.port))
        servers = tuple((s.info.host, s.info.port) for s in self.servers)
        for role_rank, entry in list(enumerate(self.servers)) + sorted(self.workers.items()):
            book = AddressBook(servers, self.options.num_worker_machines, self.local_size or 1, role_rank,
                               self.job_id, shutdown_leaves=self.options.shutdown_leaves)
            self.listener.send(Command.ADDRESS_BOOK, SCHEDULER_SENDER,
                               payload=json_payload(book.to_json()), identity=entry.identity)
        self.book_sent = True
        now = time.monotonic()  # heartbeats are watched from here on
        for entry in self._nodes():
            entry.last_heard = now
        machines = self.options.num_worker_machines
        nodes = [_count(len(servers), "server")] if servers else []
        nodes.append(f"{_count(len(self.workers), 'worker process', 'worker processes')} on "
                     f"{_count(machines, 'machine')}")
        job_log.info("all nodes registered in %.1f s: %s", now - self._started, ", ".join(nodes))

    def _members(self, group: int) -> List[bytes]:
        members = [w.identity for w in self.workers.values()]
        if group == BARRIER_ALL:
            members += [s.identity for s in self.servers]
        return members

    def _barrier(self, message: Message) -> None:
        group = message.header.aux
        if group not in self.barriers:
            raise TransportError(f"unknown barrier group {group}")
        if not self.book_sent:
            raise TransportError("barrier before every node registered")
        waiting = self.barriers[group]
        waiting.add(message.identity)
        if message.header.round == BARRIER_ASK_ARRIVAL:  # before any release, on the same connection
            self.listener.send(Command.BARRIER_ARRIVED, SCHEDULER_SENDER, aux=group, identity=message.identity)
        members = self._members(group)
        if waiting >= set(members):
            # The release names the sender whose arrival completed the barrier (hvd.join's "last rank").
            for identity in members:
                self.listener.send(Command.BARRIER_RELEASE, SCHEDULER_SENDER, key=max(0, message.header.sender),
                                   aux=group, identity=identity)
            waiting.clear()

    def _finalize(self, message: Message) -> None:
        rank = message.header.sender
        if rank not in self.workers or self.workers[rank].identity != message.identity:
            raise TransportError(f"finalize from unknown worker rank {rank}")
        self.finalized.add(rank)
        self.workers[rank].finished = True
        if self._job_over():
            for entry in self.servers:
                self.listener.send(Command.TERMINATE, SCHEDULER_SENDER, identity=entry.identity)
            log.info("all %d workers finalized; servers told to exit", len(self.workers))


def _count(n: int, singular: str, plural: Optional[str] = None) -> str:
    return f"{n} {singular if n == 1 else plural or singular + 's'}"
