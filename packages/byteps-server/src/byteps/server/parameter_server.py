"""The parameter server's event loop (synchronous mode).

Per key (one partition of one tensor) and round, the server sums the PUSH
of every worker process, then answers every PULL of that round with the
sum: BytePS's synchronous mode. The summation runs in the C++
``ServerEngine`` (byteps.server._C) on BYTEPS_SERVER_ENGINE_THREAD threads,
straight out of the transport's receive buffers; answers are sent zero-copy from
the engine's results. A round's result is released as soon as every machine
that pushed it has its answer (its buffer returns to the engine's pool when
the last send of it is done), so a server holds sums for the rounds in
flight, not two per key.

Every message is checked: a worker whose INIT_KEY disagrees with another's
about a partition (name, size, dtype) is told so, as are the workers that
agreed, with both descriptions; a malformed message is logged and answered
with an ERROR, and the server carries on.

Join (Horovod's ``hvd.join()`` for uneven data): a worker machine that ran
out of data sends JOIN after its last push. From then on, each round of a
key that spans every machine counts the joined machine's push as zeros:
it is added when a machine that has not joined pushes, and when the JOIN
arrives for the rounds already started. A push from a joined machine comes
after every machine joined (join returns only then), so such a round is a
new one and nothing is added to it; once every machine's JOIN is in, the
server forgets them all. A round that gathers or broadcasts (its pushes'
aux is not 0) cannot take zeros for a missing rank: it completes, but its
pulls are answered with an ERROR naming the joined rank, as Horovod fails
an allgather or broadcast after a rank joined.

Asynchronous keys (BYTEPS_ENABLE_ASYNC, docs/async.md): round 0 is a
synchronous broadcast whose result becomes the key's store; every later
push is a delta, added to the store as it arrives (each worker's in order,
each once), and a pull is answered with a copy of the store at once, or,
with BYTEPS_ASYNC_MAX_STALENESS=s, once the slowest worker is at most s
pushes behind the puller.

Backup workers (BYTEPS_BACKUP_WORKERS=b): a key declared with a quorum
closes each round at that many machines' pushes; a push for a round
already closed is acknowledged, dropped and counted, and its pull is
answered with that round's sum, the one every other machine got (the
server keeps each closed round until every machine has pushed past it), so
the late machine applies the same updates. A round's pulls wait while some
machine is more than BACKUP_MAX_LAG rounds behind it, which bounds what is
kept. The answer's aux says how many machines the sum holds and how many
rounds had closed after it; a machine that knows it is behind may then
skip a closed round: its PULL, flagged FLAG_SKIPPED and with no push, is
answered with that round's sum and counts as having moved past it.

A push flagged FLAG_PULL is also its sender's pull of that round, handled
right after the push: pipelined workers send one message per partition
where they sent two. Its PUSH_ACK is left out when the pull is answered at
once (the push completed the round, or closed it late): the answer returns
the same scheduling credit a moment later.

Server-side scheduling (BYTEPS_SERVER_ENABLE_SCHEDULE=1): the messages
waiting at the listener are read together and their pushes handled in key
order (earlier-declared tensors, lower partitions first), so the sums the
workers need first are answered first.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Dict, List, Optional, Set, Tuple

import numpy as np

from byteps.common.compression import ServerPartition
from byteps.common.config import Config
from byteps.common.dtypes import DType
from byteps.common.job_report import ProcessReport
from byteps.common.tensor_description import MISMATCH_ADVICE, PartitionSpec, describe_op, quorum_aux
from byteps.common.tracing import SERVER_PID_BASE, SERVER_TRACKS, Tracer, server_trace_path
from byteps.server.engine import create_engine
from byteps.server.stall_inspector import PartialRound, StallInspector
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
from byteps.transport.frames import (
    FLAG_AVERAGE,
    FLAG_BARE,
    FLAG_PULL,
    FLAG_SKIPPED,
    FLAG_ZEROS,
    command_name,
    parse_json_payload,
)

__all__ = ["ParameterServer"]

log = logging.getLogger("byteps.server")
#: One line per PUSH in arrival order at PS_VERBOSE=2, as ps-lite logged its messages.
wire_log = logging.getLogger("byteps.transport.server_pushes")
_STALL_POLL_S = 1.0
#: Backup workers: a round's sum is held back while a machine is more rounds behind it than this.
BACKUP_MAX_LAG = 4
#: With server-side scheduling, at most this many waiting messages are read and ordered at a time.
_SCHEDULE_BATCH = 64


class StallShutdown(TransportError):
    """A round waited past BYTEPS_STALL_SHUTDOWN_TIME: the job ends."""


@dataclasses.dataclass
class KeyState:
    spec: PartitionSpec
    declared_by: Dict[bytes, int] = dataclasses.field(default_factory=dict)  # identity -> worker rank
    pending_pulls: List[Tuple[bytes, int]] = dataclasses.field(default_factory=list)  # (identity, round)
    bare_pulls: Set[Tuple[bytes, int]] = dataclasses.field(default_factory=set)  # pending pulls flagged FLAG_BARE
    pushed: Set[bytes] = dataclasses.field(default_factory=set)  # who pushed in the round being summed
    # round -> who pushed it and has not had its pull answered: when none is left, the engine lets the sum go
    unanswered: Dict[int, Set[bytes]] = dataclasses.field(default_factory=dict)
    round_started: float = 0.0  # time.monotonic() of the first push of the round being summed
    round_flags: int = 0  # flags of that first push (FLAG_AVERAGE): every push of a round must agree
    round_tag: int = 0  # and its aux (1 + a broadcast's root, else 0), which must agree too
    round_after_join: bool = False  # a joined machine pushed this round: it started after every machine joined
    codec: Optional[ServerPartition] = None  # a compressed key: pushes decompressed, the sum compressed again
    round_lr: float = float("nan")  # the learning rate the round's first compressed push carried
    compressed: Dict[int, np.ndarray] = dataclasses.field(default_factory=dict)  # round -> compressed sum (last 2)
    store: Optional[np.ndarray] = None  # an asynchronous key's parameters (uint8), from its round-0 broadcast on
    applied: Dict[bytes, int] = dataclasses.field(default_factory=dict)  # asynchronous: identity -> deltas added
    held_pulls: List[Tuple[bytes, int]] = dataclasses.field(default_factory=list)  # asynchronous, past the bound
    history: Dict[int, bytes] = dataclasses.field(default_factory=dict)  # quorum: closed round -> its answer
    last_round: Dict[bytes, int] = dataclasses.field(default_factory=dict)  # quorum: identity -> last round pushed


class ParameterServer:
    """One server process: register, then sum pushes and answer pulls until told to stop."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.context = config.transport_context()
        host = resolve_host(config.node_host, config.interface, config.root_uri)
        # A push is at most one partition; leave room for any partition size workers use.
        self.max_partition_bytes = max(config.partition_bytes, 1 << 20)
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
        # (key, round) -> why a worker failed it: later pushes of that round are refused with the reason
        self.failed_rounds: Dict[Tuple[int, int], str] = {}
        # identity -> rank of the worker machines that joined (hvd.join) while others still push
        self.joined: Dict[bytes, int] = {}
        self._zeros: Dict[int, memoryview] = {}  # nbytes -> a read-only zero buffer pushed for joined machines
        self.join_failed: Dict[Tuple[int, int], str] = {}  # (key, round) a joined machine could not take part in
        self.stall_inspector = StallInspector(config.stall_check_s, config.stall_shutdown_s, self.num_workers,
                                              "worker ranks" if self.local_size == 1 else "worker machines")
        self.async_pushes = 0  # deltas added to asynchronous keys' stores
        self.late_pushes = 0  # backup workers: pushes for rounds already closed, dropped
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
        partial = [PartialRound(key, state.spec.name, self.engine.completed_round(key) + 1, state.round_started,
                                {self._rank_of(state, identity) // self.local_size for identity in state.pushed})
                   for key, state in self.keys.items() if state.pushed]
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

    def _rank_of(self, state: KeyState, identity: bytes) -> int:
        rank = state.declared_by.get(identity)
        return self.joined.get(identity, 0) if rank is None else rank

    def report(self) -> ProcessReport:
        """What this server received and sent since registration, for the job's summary."""
        counters = self.listener.counters
        return ProcessReport("server", self.rank, time.monotonic() - self.registered_at,
                             bytes_sent=counters.bytes_sent, bytes_received=counters.bytes_received,
                             async_pushes=self.async_pushes, late_pushes=self.late_pushes,
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
                if header.flags & FLAG_PULL:
                    self._pull_after_push(message)
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
        if state is not None and message.identity not in state.declared_by \
                and len(state.declared_by) >= contributors:
            raise ValueError(f"key {key} already has its {contributors} workers")
        if state is None:
            codec = None
            if spec.compression:
                codec = ServerPartition.from_wire(spec.compression, DType(spec.dtype),
                                                  spec.nbytes // DType(spec.dtype).itemsize)
            if spec.quorum and not 0 < spec.quorum < contributors:
                raise ValueError(f"{spec.describe()}: a quorum must be below the {contributors} machines")
            self.engine.declare(key, spec.nbytes, spec.dtype, spec.quorum or contributors)
            state = self.keys[key] = KeyState(spec, codec=codec)
        elif spec != state.spec:
            text = (f"mismatch for key {key}: worker {message.header.sender} declares {spec.describe()}, "
                    f"worker {next(iter(state.declared_by.values()))} declared {state.spec.describe()}; "
                    f"{MISMATCH_ADVICE}")
            for identity in state.declared_by:
                self._send_error(identity, key, text)
            raise ValueError(text)
        state.declared_by[message.identity] = message.header.sender

    def _state_for(self, message: Message) -> KeyState:
        state = self.keys.get(message.header.key)
        if state is None or message.identity not in state.declared_by:
            raise ValueError(f"key {message.header.key} was not initialized by this worker (INIT_KEY first)")
        return state

    def _fail_round(self, message: Message) -> None:
        """A worker failed a round before pushing it (a mismatch among its machine's ranks): fail it everywhere."""
        header = message.header
        text = bytes(message.payload).decode(errors="replace") if message.payload is not None else "(no reason)"
        self.failed_rounds[(header.key, header.round)] = text
        state = self.keys.get(header.key)
        if state is None:
            return
        for identity in state.declared_by:
            if identity != message.identity:
                self._send_error(identity, header.key, text, header.round)
        state.pending_pulls = [(i, r) for i, r in state.pending_pulls if r != header.round]
        state.bare_pulls = {(i, r) for i, r in state.bare_pulls if r != header.round}
        state.unanswered.pop(header.round, None)

    def _push(self, message: Message) -> None:
        header = message.header
        failed = self.failed_rounds.get((header.key, header.round))
        if failed is not None:
            raise ValueError(failed)
        state = self._state_for(message)
        if header.dtype != state.spec.dtype:
            raise ValueError(f"push of dtype code {header.dtype} for {state.spec.describe()}")
        if wire_log.isEnabledFor(logging.DEBUG):
            wire_log.debug("PUSH key %d round %d from worker %d (%s)", header.key, header.round, header.sender,
                           state.spec.name)
        if state.spec.asynchronous and header.round > 0:
            self._push_delta(message, state)
            return
        if state.spec.quorum:
            state.last_round[message.identity] = header.round
            if header.round <= self.engine.completed_round(header.key):
                self._drop_late_push(message, state)
                return
        if message.identity in state.pushed:
            raise ValueError(f"second push of round {header.round} for {state.spec.describe()}")
        flags = header.flags & ~(FLAG_ZEROS | FLAG_PULL | FLAG_BARE)  # what the round's pushes must agree on
        if state.pushed and (flags, header.aux) != (state.round_flags, state.round_tag):
            self._refuse_round(header.key, state, message)
        payload = message.payload if message.payload is not None else b""
        zeros = bool(header.flags & FLAG_ZEROS)
        if zeros:  # a gather's partition this worker has no bytes in: zeros, not sent
            if payload or state.codec is not None:
                raise ValueError(f"a push flagged zeros must carry no payload and an uncompressed key "
                                 f"({state.spec.describe()})")
            payload = self._zeros_of(state.spec.nbytes)
        received = time.time() if self.tracer is not None and self.tracer.traces(header.round) else 0.0
        if state.codec is not None:  # summed dense; the engine holds the decompressed array until the round ends
            payload, lr = state.codec.decompress_push(payload)
            if not state.pushed:
                state.round_lr = lr
        complete = self.engine.push(header.key, header.round, payload, zeros=zeros)
        state.unanswered.setdefault(header.round, set()).add(message.identity)
        if received:
            self.tracer.span("receive", state.spec.name, received, time.time(), key=header.key,
                             partition=state.spec.partition, worker=header.sender, step=header.round + 1)
        # The ack frees the worker's scheduling credit; it depends on nothing
        # but this push, so no worker's credit waits on another worker.
        self._acknowledge(message)
        if not state.pushed:
            state.round_started, state.round_flags, state.round_tag = time.monotonic(), flags, header.aux
        state.pushed.add(message.identity)
        if complete:
            self._round_complete(header.key, state)
        elif state.spec.quorum and state.pending_pulls:  # a lagging machine moved: held sums may go
            self._answer_pulls(header.key, state)
        elif message.identity in self.joined:
            state.round_after_join = True
        elif self.joined and not state.round_after_join:
            self._add_joined_zeros(header.key, state)

    def _acknowledge(self, message: Message) -> None:
        """PUSH_ACK for one push, except to a push that carries its pull: :meth:`_pull_after_push` decides."""
        if not message.header.flags & FLAG_PULL:
            self._send_ack(message)

    def _send_ack(self, message: Message) -> None:
        header = message.header
        self.listener.send(Command.PUSH_ACK, self.rank, header.key, header.round, identity=message.identity)

    def _pull_after_push(self, message: Message) -> None:
        """The pull a push carried (FLAG_PULL), as if it had come right after it; acknowledged unless answered."""
        header = message.header
        self._pull(Message(header._replace(command=Command.PULL, payload_bytes=0, flags=header.flags & FLAG_BARE),
                           None, message.identity))
        state = self.keys[header.key]
        waiting = (message.identity, header.round)
        if waiting in state.pending_pulls or waiting in state.held_pulls:
            self._send_ack(message)

    def _round_complete(self, key: int, state: KeyState) -> None:
        round_ = self.engine.completed_round(key)
        if self.tracer is not None and self.tracer.traces(round_):
            finished = time.time()  # the round began at its first push (state.round_started, monotonic)
            self.tracer.span("sum", state.spec.name, finished - (time.monotonic() - state.round_started), finished,
                             key=key, partition=state.spec.partition, step=round_ + 1)
        if state.spec.asynchronous and state.store is None:  # the initial broadcast: the store begins with it
            state.store = np.frombuffer(self.engine.result(key, round_), dtype=np.uint8).copy()
        if state.codec is not None:
            state.compressed[round_] = state.codec.compress_sum(self.engine.result(key, round_), state.round_lr)
            state.compressed.pop(round_ - 2, None)  # pulls come for the last two rounds at most, like the engine's
        if state.spec.quorum:  # late machines pull this round later: keep it until all pushed past it
            answer = state.compressed[round_] if state.codec is not None else self.engine.result(key, round_)
            state.history[round_] = bytes(answer)
        if state.codec is not None or state.spec.quorum:  # pulls are answered from the copies above
            state.unanswered.pop(round_, None)
            self.engine.release(key, round_)
        state.pushed.clear()
        state.round_after_join = False
        self._answer_pulls(key, state)

    # --- join ----------------------------------------------------------------------------
    def _join(self, message: Message) -> None:
        """A worker machine joined: its pushes of the rounds in progress, and of later ones, are zeros."""
        if message.identity in self.joined:
            raise ValueError(f"worker {message.header.sender} joined twice before every worker joined")
        self.joined[message.identity] = message.header.sender
        if len(self.joined) == self.num_workers:  # everyone is in: every earlier round is complete
            self.joined.clear()
            return
        for key, state in self.keys.items():
            if state.pushed and not state.round_after_join:
                self._add_joined_zeros(key, state)

    def _add_joined_zeros(self, key: int, state: KeyState) -> None:
        """Push zeros for each joined machine missing from ``key``'s round (keys over every machine only)."""
        if (state.spec.contributors or self.num_workers) != self.num_workers:
            return  # a process set's key: join covers collectives over every rank (docs/horovod-compatibility.md)
        for identity in list(self.joined):
            if identity in state.pushed:
                continue
            zeros = self._zeros_of(state.spec.nbytes)
            round_ = self.engine.completed_round(key) + 1
            if state.round_tag:
                self.join_failed[(key, round_)] = (
                    f"{state.spec.describe()} {describe_op(False, state.round_tag)}, but worker "
                    f"{self.joined[identity]} has joined (hvd.join()): only allreduces count a joined rank as "
                    "zeros; allgather, broadcast and the other collectives need every rank")
            complete = self.engine.push(key, round_, zeros, zeros=True)
            state.pushed.add(identity)
            if complete:
                self._round_complete(key, state)
                return

    def _zeros_of(self, nbytes: int) -> memoryview:
        """A read-only block of zeros, one per size: what a push flagged zeros stands for (the engine only
        counts it, and keeps it as the sum of a round of zeros alone)."""
        zeros = self._zeros.get(nbytes)
        if zeros is None:
            zeros = self._zeros[nbytes] = memoryview(bytes(nbytes))
        return zeros

    def _refuse_round(self, key: int, state: KeyState, message: Message) -> None:
        """A push that averages where the round's others sum, or names another broadcast root: fail them all."""
        header = message.header
        first = state.declared_by[next(iter(state.pushed))]
        mine = describe_op(bool(header.flags & FLAG_AVERAGE), header.aux)
        theirs = describe_op(bool(state.round_flags & FLAG_AVERAGE), state.round_tag)
        text = (f"mismatch for {state.spec.describe()}: worker {header.sender} {mine} "
                f"but worker {first} {theirs}; every worker must use the same op (and root) for a tensor")
        for identity in state.pushed:
            self._send_error(identity, key, text, message.header.round)
        raise ValueError(text)

    # --- asynchronous keys and backup workers -------------------------------------------
    def _push_delta(self, message: Message, state: KeyState) -> None:
        """An asynchronous key's delta: added to the store now, once, in each worker's order."""
        header = message.header
        expected = state.applied.get(message.identity, 0) + 1
        if header.round != expected or state.store is None:
            raise ValueError(f"asynchronous push of round {header.round} for {state.spec.describe()}: expected "
                             f"round {expected}, after the initial broadcast (round 0) completed")
        payload = message.payload if message.payload is not None else b""
        if len(payload) != state.spec.nbytes:
            raise ValueError(f"push of {len(payload)} bytes for {state.spec.describe()}")
        self.engine.reduce_into(state.store, payload, state.spec.dtype)
        state.applied[message.identity] = header.round
        self.async_pushes += 1
        self._acknowledge(message)
        if state.held_pulls:
            self._answer_async_pulls(header.key, state)

    def _pull_store(self, message: Message, state: KeyState) -> None:
        header = message.header
        if state.applied.get(message.identity, 0) < header.round:
            raise ValueError(f"pull of round {header.round} for {state.spec.describe()} before its push")
        state.held_pulls.append((message.identity, header.round))
        self._answer_async_pulls(header.key, state)

    def _answer_async_pulls(self, key: int, state: KeyState) -> None:
        """Answer the pulls within BYTEPS_ASYNC_MAX_STALENESS of the slowest worker, with the store as it is."""
        bound = self.config.async_max_staleness
        slowest = min(state.applied.get(identity, 0) for identity in state.declared_by)
        waiting = []
        for identity, round_ in state.held_pulls:
            if bound is not None and round_ - slowest > bound:
                waiting.append((identity, round_))
                continue
            # A copy: the store changes with the next push while this answer may still be queued.
            self.listener.send(Command.PULL_RESPONSE, self.rank, key, round_, payload=state.store.tobytes(),
                               dtype=state.spec.dtype, identity=identity)
        state.held_pulls = waiting

    def _drop_late_push(self, message: Message, state: KeyState) -> None:
        """Backup workers: a push for a round that closed without it is acknowledged and dropped."""
        header = message.header
        self.late_pushes += 1
        log.debug("dropped the late push of round %d for %s from worker %d (round %d closed)", header.round,
                  state.spec.describe(), header.sender, self.engine.completed_round(header.key))
        self._acknowledge(message)
        if state.pending_pulls:  # a lagging machine moved: held sums may go
            self._answer_pulls(header.key, state)

    def _pull(self, message: Message) -> None:
        header = message.header
        failed = self.failed_rounds.get((header.key, header.round)) or self.join_failed.get(
            (header.key, header.round))
        if failed is not None:
            raise ValueError(failed)
        state = self._state_for(message)
        if state.spec.asynchronous and header.round > 0:
            self._pull_store(message, state)
            return
        completed = self.engine.completed_round(header.key)
        if header.flags & FLAG_SKIPPED:  # backup workers: a closed round this machine did not compute
            if not state.spec.quorum or header.round not in state.history:
                raise ValueError(f"skipped pull of round {header.round} for {state.spec.describe()}: only a "
                                 "closed round of a key with backup workers can be skipped")
            state.last_round[message.identity] = max(state.last_round.get(message.identity, -1), header.round)
        if state.spec.quorum and header.round in state.history:
            completed = header.round  # a late machine's pull of a closed round
        # A worker pulls round r after pushing it, and pushes r + 1 only after
        # its pull of r was answered: r is the last completed round or the next.
        if header.round not in (completed, completed + 1):
            raise ValueError(f"pull of round {header.round} for {state.spec.describe()}: "
                             f"the last completed round is {completed}")
        if any(identity == message.identity for identity, _ in state.pending_pulls):
            raise ValueError(f"second pending pull for {state.spec.describe()}")
        state.pending_pulls.append((message.identity, header.round))
        if header.flags & FLAG_BARE:  # the worker holds the sum already: the answer is a header
            state.bare_pulls.add((message.identity, header.round))
        if self.engine.completed_round(header.key) >= header.round:
            self._answer_pulls(header.key, state)

    def _answer_pulls(self, key: int, state: KeyState) -> None:
        completed = self.engine.completed_round(key)
        still_waiting = []
        # A machine not heard from yet (not even its INIT_KEY) has pushed nothing: it is the slowest.
        machines = state.spec.contributors or self.num_workers
        slowest = min(state.last_round.values()) if len(state.last_round) == machines else -1
        for identity, round_ in state.pending_pulls:
            if round_ > completed or (state.spec.quorum and round_ - slowest > BACKUP_MAX_LAG):
                still_waiting.append((identity, round_))
                continue
            bare = (identity, round_) in state.bare_pulls
            state.bare_pulls.discard((identity, round_))
            self._answer_pull(key, state, identity, round_, bare, completed)
            waiting = state.unanswered.get(round_)
            if waiting is not None:
                waiting.discard(identity)
                if not waiting:  # every machine that pushed the round has its answer (or is being sent it)
                    del state.unanswered[round_]
                    self.engine.release(key, round_)
        state.pending_pulls = still_waiting
        for old in [r for r in state.history if r < slowest]:  # every machine pushed past it: never pulled again
            del state.history[old]

    def _answer_pull(self, key: int, state: KeyState, identity: bytes, round_: int, bare: bool,
                     completed: int) -> None:
        """Send one pull its answer. The send holds a view of the engine's sum, so once the engine releases the
        round its buffer goes back to the pool only when the send is done."""
        failed = self.join_failed.get((key, round_))
        if failed is not None:
            self._send_error(identity, key, failed, round_)
            return
        if bare:
            result = None
        elif state.spec.quorum:
            result = state.history[round_]
        else:
            result = self.engine.result(key, round_) if state.codec is None else state.compressed[round_]
        sending = time.time() if self.tracer is not None and self.tracer.traces(round_) else 0.0
        aux = quorum_aux(state.spec.quorum, completed - round_) if state.spec.quorum else 0
        self.listener.send(Command.PULL_RESPONSE, self.rank, key, round_, payload=result,
                           dtype=state.spec.dtype, identity=identity, aux=aux)
        if wire_log.isEnabledFor(logging.DEBUG):
            wire_log.debug("ANSWER key %d round %d to worker %d (%s)", key, round_,
                           self._rank_of(state, identity), state.spec.name)
        if sending:
            self.tracer.span("answer", state.spec.name, sending, time.time(), key=key,
                             partition=state.spec.partition, worker=self._rank_of(state, identity),
                             step=round_ + 1)
