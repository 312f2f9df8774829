"""The parameter server's event loop: one process that receives, checks and dispatches every message.

:class:`ParameterServer` registers with the scheduler, then polls its
listener and the scheduler's connection until told to stop. A worker's
message is received (zero-copy), admitted by the job secret's gate, and
dispatched by command:

- INIT_KEY declares a key (one partition of one tensor). Every worker's
  description must match the first (name, size, dtype); one that does not
  is told so, as are the workers that agreed, with both descriptions. The
  first INIT_KEY picks the key's *round policy* from its PartitionSpec
  (:mod:`byteps.server.rounds`): what a round of the key is, synchronous,
  with backup workers, asynchronous, compressed, or a row-sparse table's
  rows summed by id (docs/sparse.md).
- PUSH and PULL are checked here (the key was declared by this worker, the
  dtype is the key's, no worker failed the round) and handed to the key's
  policy. A push flagged FLAG_PULL is also its sender's pull of that round,
  handled right after the push: pipelined workers send one message per
  partition where they sent two. Its PUSH_ACK is left out when the pull is
  answered at once (the answer returns the same scheduling credit).
- JOIN (hvd.join) records the sender's machine as joined
  (:mod:`byteps.server.rounds.joined`) and lets every key's round in
  progress take its zeros.
- ERROR from a worker fails the round it names on every worker (a mismatch
  among one machine's ranks).

A malformed or refused message is logged and answered with an ERROR, and
the server carries on. Once a second, the stall inspector looks at the
rounds some machines pushed and others not (BYTEPS_STALL_CHECK_TIME);
past BYTEPS_STALL_SHUTDOWN_TIME such a round ends the job.

Server-side scheduling (BYTEPS_SERVER_ENABLE_SCHEDULE=1): the messages
waiting at the listener are read together and their pushes handled in key
order (earlier-declared tensors, lower partitions first), so the sums the
workers need first are answered first.
"""

from __future__ import annotations

import logging
import time
from typing import Dict, List, Optional, Tuple

from byteps.common.config import Config
from byteps.common.job_report import ProcessReport
from byteps.common.tensor_description import MISMATCH_ADVICE, PartitionSpec
from byteps.common.tracing import SERVER_PID_BASE, SERVER_TRACKS, Tracer, server_trace_path
from byteps.server.engine import create_engine
from byteps.server.rounds import BACKUP_MAX_LAG, JoinedMachines, KeyState, RoundServices, declare_key, wire_log
from byteps.server.stall_inspector import StallInspector
from byteps.transport import (
    Command,
    FrameError,
    Gate,
    Message,
    NodeInfo,
    Poller,
    SchedulerClient,
    TransportError,
    tcp_address,
)
from byteps.transport.addressing import resolve_host
from byteps.transport.frames import FLAG_BARE, FLAG_LOOKUP, FLAG_PULL, command_name, parse_json_payload

__all__ = ["BACKUP_MAX_LAG", "ParameterServer", "StallShutdown"]

log = logging.getLogger("byteps.server")
_STALL_POLL_S = 1.0
#: With server-side scheduling, at most this many waiting messages are read and ordered at a time.
_SCHEDULE_BATCH = 64


class StallShutdown(TransportError):
    """A round waited past BYTEPS_STALL_SHUTDOWN_TIME: the job ends."""


class ParameterServer:
    """One server process: register, then hand pushes and pulls to their keys' rounds until told to stop.

    What ``byteps-server`` runs with DMLC_ROLE=server::

        server = ParameterServer(Config.from_env())   # registers with the scheduler
        try:
            server.run()                              # until the scheduler's TERMINATE
        finally:
            server.close()
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.context = config.transport_context()
        host = resolve_host(config.node_host, config.interface, config.root_uri)
        # A push is at most one partition; leave room for any partition size workers use.
        self.max_partition_bytes = config.max_partition_bytes
        self.listener = self.context.listen(tcp_address(host, 0), max_payload_bytes=self.max_partition_bytes)
        self.scheduler = SchedulerClient(self.context, config.root_uri, config.root_port,
                                         config.rendezvous_timeout, config.heartbeat_interval_s,
                                         config.heartbeat_timeout_s, config.secret)
        book = self.scheduler.register(NodeInfo(role="server", host=host, port=self.listener.port,
                                                        settings=config.job_settings()))
        self.registered_at = time.monotonic()
        self.rank = book.rank
        self.tracer: Optional[Tracer] = None
        if config.trace_on:
            self.tracer = Tracer(server_trace_path(config.trace_dir, self.rank), f"server {self.rank}",
                                 SERVER_PID_BASE + self.rank, SERVER_TRACKS, config.trace_start_step,
                                 config.trace_end_step)
        # Local aggregation: one process per worker machine pushes each key.
        self.num_workers = book.num_worker_machines
        self.local_size = book.local_size
        self.engine = create_engine(config.server_engine_threads, self.num_workers)
        self.gate = Gate(config.secret, self.rank, log)
        self.keys: Dict[int, KeyState] = {}
        # What every key's round policy shares: the engine, how to answer, the joined machines, the counters.
        self.rounds = RoundServices(self.engine, self.listener.send, self.rank, self.num_workers, self.local_size,
                                    JoinedMachines(self.num_workers, self.local_size), self.tracer,
                                    config.async_max_staleness, self.max_partition_bytes)
        # (key, round) -> why a worker failed it: later pushes of that round are refused with the reason
        self.failed_rounds: Dict[Tuple[int, int], str] = {}
        self.stall_inspector = StallInspector(config.stall_check_s, config.stall_shutdown_s, self.num_workers,
                                              "worker ranks" if self.local_size == 1 else "worker machines")
        self.running = True
        log.info("server %d at %s sums for %d worker machines on %d threads", self.rank,
                 self.listener.address, self.num_workers, config.server_engine_threads)

    def run(self) -> None:
        poller = Poller()
        poller.register(self.listener)
        poller.register(self.scheduler.connection)
        next_inspection = time.monotonic()
        while self.running:
            wait_s = self.scheduler.pulse()  # heartbeat; NodeFailure if the scheduler went silent
            if self.stall_inspector.enabled:
                # Once a second, not once a message: the inspection walks every key.
                now = time.monotonic()
                if now >= next_inspection:
                    self._inspect_stalls()
                    next_inspection = now + _STALL_POLL_S
                until = max(0.0, next_inspection - now)
                wait_s = until if wait_s is None else min(wait_s, until)
            for ready in poller.poll(wait_s):
                if ready is self.listener and self.config.server_enable_schedule:
                    self._handle_waiting_messages()
                elif ready is self.listener:
                    self._handle_worker_message()
                else:
                    self._handle_scheduler_message()

    def _inspect_stalls(self) -> None:
        partial = [p for p in (state.policy.partial_round() for state in self.keys.values())
                   if p is not None and (p.key, p.round) not in self.failed_rounds]
        fatal = self.stall_inspector.inspect(partial)
        if not fatal:
            return
        text = "; ".join(stall.describe() for stall in fatal) + \
            f" (BYTEPS_STALL_SHUTDOWN_TIME={self.config.stall_shutdown_s:g}): ending the job"
        for stall in fatal:
            for key in stall.keys:
                for identity in self.keys[key].declared_by:
                    self._send_error(identity, key, text, stall.round)
        raise StallShutdown(text)

    def report(self) -> ProcessReport:
        """What this server received and sent since registration, for the job's summary."""
        counters = self.listener.counters
        return ProcessReport("server", self.rank, time.monotonic() - self.registered_at,
                             bytes_sent=counters.bytes_sent, bytes_received=counters.bytes_received,
                             async_pushes=self.rounds.async_pushes, late_pushes=self.rounds.late_pushes,
                             shared_payloads=counters.shared_sent + counters.shared_received,
                             rdma_payloads=counters.rdma_sent + counters.rdma_received)

    def close(self) -> None:
        self.listener.close()
        self.scheduler.close()
        self.context.close()

    def _handle_scheduler_message(self) -> None:
        message = self.scheduler.recv()  # NodeFailure when the scheduler reports a dead node
        if message.header.command == Command.TERMINATE:
            owned = sum(state.spec.nbytes for state in self.keys.values())
            log.info("server %d: all workers finished, exiting; sums were held in %.1f MiB of buffers for "
                     "%d keys of %.1f MiB", self.rank, self.engine.sum_bytes / 2**20, len(self.keys), owned / 2**20)
            self.running = False
        elif message.header.command != Command.HEARTBEAT:
            log.error("unexpected %s from the scheduler", command_name(message.header.command))

    def _receive(self) -> Optional[Message]:
        message = self.listener.recv_or_refuse(self.rank, log)
        if message is None or not self.gate.admit(self.listener, message):
            return None
        return message

    def _handle_worker_message(self) -> None:
        message = self._receive()
        if message is not None:
            self._dispatch(message)

    def _handle_waiting_messages(self) -> None:
        """Server-side scheduling: read what waits, then handle INIT_KEYs, pushes and pulls in key order, the
        rest as they came.

        Reordering is safe: a push needs its key's INIT_KEY (which came
        before it); a pull comes after its own push (an asynchronous key's
        must; one a push carries is handled with it) and may wait for its
        round's other pushes anyway; a worker's JOIN or ERROR follows its
        own pushes in both orders.
        """
        batch: List[Message] = []
        while len(batch) < _SCHEDULE_BATCH and (not batch or self.listener.wait_readable(0)):
            message = self._receive()
            if message is None:
                if not self.listener.wait_readable(0):
                    break
                continue
            batch.append(message)
        by_key = lambda command: sorted((m for m in batch if m.header.command == command),  # noqa: E731
                                        key=lambda m: m.header.key)
        inits = [m for m in batch if m.header.command == Command.INIT_KEY]
        rest = [m for m in batch if m.header.command not in (Command.INIT_KEY, Command.PUSH, Command.PULL)]
        for message in inits + by_key(Command.PUSH) + by_key(Command.PULL) + rest:
            self._dispatch(message)

    def _dispatch(self, message: Message) -> None:
        header = message.header
        try:
            if header.command == Command.PUSH:
                self._push(message)
            elif header.command == Command.PULL:
                self._pull(message)
            elif header.command == Command.INIT_KEY:
                self._init_key(message)
            elif header.command == Command.ERROR:
                self._fail_round(message)
            elif header.command == Command.JOIN:
                self._join(message)
            else:
                raise TransportError(f"unexpected command {command_name(header.command)} at a server")
        except (TransportError, FrameError, ValueError, KeyError, TypeError) as exc:
            log.error("refused %s for key %d from worker %d: %s", command_name(header.command),
                      header.key, header.sender, exc)
            self._send_error(message.identity, header.key, str(exc), header.round)

    def _send_error(self, identity: bytes, key: int, text: str, round_: int = 0) -> None:
        self.listener.send(Command.ERROR, self.rank, key, round_, payload=text.encode(), identity=identity)

    def _init_key(self, message: Message) -> None:
        key = message.header.key
        fields = parse_json_payload(message.payload if message.payload is not None else b"")
        spec = PartitionSpec(**fields)
        spec.check(self.max_partition_bytes)
        state = self.keys.get(key)
        contributors = spec.contributors or self.num_workers
        if contributors > self.num_workers:
            raise ValueError(f"{spec.describe()}: more contributors than the job's {self.num_workers} worker machines")
        # a held table's rows are looked up by every worker process, its rounds pushed by one per machine
        declarers = contributors * (self.rounds.local_size if spec.held is not None else 1)
        if state is not None and message.identity not in state.declared_by \
                and len(state.declared_by) >= declarers:
            raise ValueError(f"key {key} already has its {declarers} workers")
        if state is None:
            state = self.keys[key] = declare_key(key, spec, self.rounds)
        elif spec != state.spec:
            text = (f"mismatch for key {key}: worker {message.header.sender} declares {spec.describe()}, "
                    f"worker {next(iter(state.declared_by.values()))} declared {state.spec.describe()}; "
                    f"{MISMATCH_ADVICE}")
            state.refused.add(message.identity)
            self._fail_everywhere(state, message, text)
            raise ValueError(text)
        state.declared_by[message.identity] = message.header.sender

    def _declared_state(self, message: Message) -> KeyState:
        """The key's state, once its round passed the failed-rounds check and this worker declared the key."""
        header = message.header
        if self.failed_rounds:
            failed = self.failed_rounds.get((header.key, header.round))
            if failed is not None:
                raise ValueError(failed)
        state = self.keys.get(header.key)
        if state is None or message.identity not in state.declared_by:
            text = f"key {header.key} was not initialized by this worker (INIT_KEY first)"
            if state is not None and message.identity in state.refused:
                # its declaration was refused: the others must not wait for its push (a stranger's push of a key
                # it never declared is refused to it alone)
                text = (f"worker {header.sender} pushed round {header.round} of {state.spec.describe()} without "
                        f"having declared it as the others did (its declaration was refused); {MISMATCH_ADVICE}")
                self._fail_everywhere(state, message, text)
            raise ValueError(text)
        return state

    def _fail_everywhere(self, state: KeyState, message: Message, text: str) -> None:
        """Fail the round ``message`` is for on every worker that declared the key but its sender (who hears of
        it from the caller's raise), now and when their pushes come: no worker waits for a round that cannot
        close. An INIT_KEY is sent for the round the worker pushes first."""
        round_ = message.header.round
        self.failed_rounds[(state.key, round_)] = text
        for identity in state.declared_by:
            if identity != message.identity:
                self._send_error(identity, state.key, text, round_)
        state.policy.fail_round(round_)

    def _push(self, message: Message) -> None:
        header = message.header
        state = self._declared_state(message)
        if header.dtype != state.spec.dtype:
            raise ValueError(f"push of dtype code {header.dtype} for {state.spec.describe()}")
        if wire_log.isEnabledFor(logging.DEBUG):
            wire_log.debug("PUSH key %d round %d from worker %d (%s)", header.key, header.round, header.sender,
                           state.spec.name)
        policy = state.policy
        policy.push(message)
        if header.flags & FLAG_PULL:
            # The pull it carries, as if it had come right after it (the checks above hold for it too);
            # acknowledged unless answered at once.
            policy.pull(Message(header._replace(command=Command.PULL, payload_bytes=0, flags=header.flags & FLAG_BARE),
                                None, message.identity))
            if policy.is_waiting(message.identity, header.round):
                self.listener.send(Command.PUSH_ACK, self.rank, header.key, header.round, identity=message.identity)

    def _pull(self, message: Message) -> None:
        header = message.header
        if header.flags & FLAG_LOOKUP:  # a held table's rows by id, outside its rounds (its round is no round's)
            state = self.keys.get(header.key)
            if state is None or message.identity not in state.declared_by or state.spec.held is None:
                self.listener.send(Command.ERROR, self.rank, header.key, header.round, flags=FLAG_LOOKUP,
                                   payload=f"key {header.key} is no server-held table this worker declared "
                                           "(INIT_KEY first)".encode(), identity=message.identity)
                return
            state.policy.pull(message)
            return
        self._declared_state(message).policy.pull(message)

    def _fail_round(self, message: Message) -> None:
        """A worker failed a round before pushing it (a mismatch among its machine's ranks): fail it everywhere."""
        header = message.header
        text = message.text("(no reason)")
        state = self.keys.get(header.key)
        if state is None:
            self.failed_rounds[(header.key, header.round)] = text
            return
        self._fail_everywhere(state, message, text)

    def _join(self, message: Message) -> None:
        """A worker machine joined: its pushes of the rounds in progress, and of later ones, are zeros."""
        if self.rounds.joined.join(message.header.sender):
            for state in self.keys.values():
                state.policy.machine_joined()
