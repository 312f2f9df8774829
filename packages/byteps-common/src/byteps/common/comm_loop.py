"""The worker's communication thread: every partition along its route.

One thread owns every endpoint of a worker process: the servers'
connections (:mod:`byteps.common.server_exchange`), the other local ranks'
(:mod:`byteps.common.local_aggregation`) and, after rendezvous, the
scheduler's. API calls hand it :class:`PushPullTask`s through a queue and
wake it through a pipe.

Each partition of a task becomes a :class:`~byteps.common.route.PartitionTrip`
with its planned route; one :class:`~byteps.common.route.RouteDispatcher`
moves it from stage to stage (the handlers are registered here), and a
task's handle completes when its last partition arrived in the output.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from byteps.common import kernels
from byteps.common.buffers import TensorView
from byteps.common.compression.feedback import TensorCompressor
from byteps.common.compression.stages import CompressionStages
from byteps.common.device_local import summed_on_gpu
from byteps.common.handle import Handle, JobLost
from byteps.common.local_aggregation import LocalGroup
from byteps.common.partition import PartitionPlan
from byteps.common.route import PartitionTrip, RouteDispatcher, Stage, plan_route
from byteps.common.server_exchange import ServerExchange
from byteps.transport import Command, Context, NodeFailure, Poller, SchedulerClient, TransportError, command_name
from byteps.transport.rendezvous import BARRIER_WORKERS

__all__ = ["PushPullTask", "BarrierRequest", "JoinRequest", "DeviceCopyDone", "CommLoop", "CommOptions"]

log = logging.getLogger("byteps.common.comm_loop")
_JOB_CHECK_S = 1.0  # how often CommOptions.job_over is asked


@dataclasses.dataclass
class PushPullTask:
    """One push_pull of one tensor, on its way through the machine and the servers."""

    name: str
    round: int
    source: TensorView
    output: TensorView
    plan: PartitionPlan
    average_over: int  # 0 for a sum, else the number of workers to divide by
    handle: Handle
    members: Optional[Tuple[int, ...]] = None  # a process set's global ranks; None: every worker
    machines: int = 0  # how many machines the members live on (0 with every worker)
    tag: int = 0  # what every rank must agree on besides averaging: 1 + the root of a broadcast, else 0
    compression: Optional[TensorCompressor] = None  # compressed on the way to the servers (averaged before)
    lr: Optional[float] = None  # the optimizer's learning rate, for error feedback's rescaling
    asynchronous: bool = False  # a parameter delta added at the servers as it comes (docs/async.md)
    quorum: int = 0  # backup workers: the machines whose pushes close a round (0: all)
    skipped: bool = False  # backup workers: a closed round pulled without a push
    closed_after: Optional[int] = None  # backup workers: rounds closed after this one, least over the partitions
    device: Any = None  # a CUDA tensor's byteps.common.device_staging.StagedTensor (None: host memory)
    #: [start, end) of this rank's nonzero bytes: partitions outside are not copied for local peers and, where
    #: this process pushes alone, go to the servers as zeros
    nonzero: Optional[Tuple[int, int]] = None
    #: byte ranges whose sum the caller does not need (held already, or not read): pulled bare (FLAG_BARE)
    skip_pull: Tuple[Tuple[int, int], ...] = ()
    #: byte ranges where the output holds the result already, or is not read: COPY_OUT leaves them as they are
    keep_output: Tuple[Tuple[int, int], ...] = ()
    started: float = 0.0  # time.time() when the comm thread started it (for the timeline)
    remaining: int = 0  # partitions not yet in the output
    network_partitions: int = 0  # partitions this process pushes
    failed: bool = False  # nothing more happens to its partitions


@dataclasses.dataclass
class BarrierRequest:
    """A barrier with the other workers, carried out by the comm thread (it owns the scheduler socket)."""

    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    error: Optional[BaseException] = None

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done.set()


@dataclasses.dataclass
class JoinRequest(BarrierRequest):
    """hvd.join(): once this worker's tasks are done, tell the servers or local peers, then a barrier.

    Done when the barrier is released (``last``: the rank whose arrival
    released it) and, with local peers, when every peer's LOCAL_JOINED is
    in (so every round started before the join is complete here).
    """

    started: bool = False
    released: bool = False
    last: int = -1


@dataclasses.dataclass(frozen=True)
class DeviceCopyDone:
    """Partitions of a CUDA tensor are in pinned host memory (or a copy failed): from the copy waiter."""

    task: PushPullTask
    indices: Tuple[int, ...]
    error: Optional[BaseException] = None


@dataclasses.dataclass(frozen=True)
class StageDone:
    """A partition's stage finished off this thread (or failed): COMPRESS or DECOMPRESS on a compression
    thread, or the GPU work of GPU-side local aggregation (its event, from the copy waiter)."""

    trip: PartitionTrip
    error: Optional[BaseException] = None


@dataclasses.dataclass(frozen=True)
class CommOptions:
    """What the comm thread needs to know about the job (from Config and the address book)."""

    rank: int
    max_payload_bytes: int
    credit_bytes: int = 0  # 0: unbounded
    pipeline: bool = True
    job_id: str = ""
    machine: int = 0  # DMLC_WORKER_ID
    local_rank: int = 0
    local_size: int = 1
    secret: Optional[bytes] = dataclasses.field(default=None, repr=False)  # authenticates local ranks too
    handshake_timeout_s: float = 120.0
    partition_bytes: int = 4096000  # BYTEPS_PARTITION_BYTES (a joined local root re-cuts partitions with it)
    tracer: Any = None  # byteps.common.tracing.Tracer while BYTEPS_TRACE_ON=1
    compress_threads: int = 0  # BYTEPS_THREADPOOL_SIZE: codecs on a pool of threads (0: on this thread)
    #: Asked about once a second: why the job is over, or None. An elastic worker's says when bpslaunch has
    #: ended its membership epoch, which a dead scheduler could not tell it.
    job_over: Optional[Callable[[], Optional[str]]] = None


class CommLoop(threading.Thread):
    """Background thread that moves one worker's partitions and keeps its heartbeat.

    After rendezvous it also owns the connection to the scheduler: it sends
    the heartbeats, serves barriers, and turns a NODE_FAILED from the
    scheduler (or the scheduler's silence) into an error for every push_pull
    in flight and every later one.
    """

    def __init__(self, context: Context, servers: List[Tuple[str, int]], options: CommOptions,
                 scheduler: Optional[SchedulerClient] = None) -> None:
        super().__init__(name="byteps-comm", daemon=True)
        self.options = options
        self.rank = options.rank
        self.tracer = options.tracer  # set_tracer() replaces it (Horovod's start_timeline)
        self.dispatcher = RouteDispatcher(self._arrived, options.tracer)
        proceed = self.dispatcher.proceed
        self.dispatcher.register(Stage.COPY_OUT, self._copy_out)
        self.dispatcher.register(Stage.DEVICE_TO_HOST, self._device_to_host)
        self.dispatcher.register(Stage.HOST_TO_DEVICE, self._host_to_device)
        self.exchange: Optional[ServerExchange] = None
        self.compression: Optional[CompressionStages] = None
        if servers:
            self.exchange = ServerExchange(context, servers, options.rank, options.max_payload_bytes,
                                           options.credit_bytes, options.pipeline, proceed, self._fail_key,
                                           alone=options.local_size == 1)
            self.dispatcher.register(Stage.PUSH, self.exchange.push)
            self.dispatcher.register(Stage.PULL, self.exchange.pull)
            self.compression = CompressionStages(
                proceed, options.compress_threads, lambda trip, error: self._enqueue(StageDone(trip, error)))
            self.dispatcher.register(Stage.COMPRESS, self.compression.compress)
            self.dispatcher.register(Stage.DECOMPRESS, self.compression.decompress)
        self.local: Optional[LocalGroup] = None
        self.copied_out = 0  # bytes COPY_OUT wrote into outputs (not those that landed there or were kept)
        if options.local_size > 1:
            self.local = LocalGroup(context, options.job_id, options.machine, options.local_rank,
                                    options.local_size, proceed, self._fail_task, options.secret,
                                    options.handshake_timeout_s, options.partition_bytes, self._after_device)
            self.dispatcher.register(Stage.COPY_IN, self.local.copy_in)
            self.dispatcher.register(Stage.LOCAL_REDUCE, self.local.local_reduce)
            self.dispatcher.register(Stage.LOCAL_BROADCAST, self.local.local_broadcast)
            self.dispatcher.register(Stage.DEVICE_COPY_IN, self.local.device.device_copy_in)
            self.dispatcher.register(Stage.DEVICE_RESULT, self.local.device.device_result)
            self.dispatcher.register(Stage.DEVICE_COPY_OUT, self.local.device.device_copy_out)
        self.scheduler = scheduler
        self._barriers: List[BarrierRequest] = []  # sent, waiting for BARRIER_RELEASE
        self._join: Optional[JoinRequest] = None  # a join in progress
        self._tasks: queue.SimpleQueue[Union[PushPullTask, BarrierRequest, DeviceCopyDone, StageDone, None]] = \
            queue.SimpleQueue()
        self._wake_read, self._wake_write = os.pipe()
        self._active: Dict[int, PushPullTask] = {}  # id(task) -> task, started and not finished
        self._fatal: Optional[BaseException] = None
        self._stopping = False
        # Set while a wake-up byte is in the pipe and the thread has not yet
        # drained the queue: further submits need not write another (each
        # write costs a system call and a thread switch).
        self._wake_pending = False

    @property
    def connections(self):
        return self.exchange.connections if self.exchange else []

    # --- called from API threads -------------------------------------------------
    def submit(self, task: PushPullTask) -> None:
        if self._fatal is not None or not self.is_alive():
            task.handle.set_error(self._fatal or JobLost("the worker's communication thread is not running"))
            return
        self._enqueue(task)

    def device_copy_done(self, task: PushPullTask, indices: Tuple[int, ...],
                         error: Optional[BaseException] = None) -> None:
        """Partitions ``indices`` of ``task`` (a CUDA tensor) reached pinned host memory (from the copy waiter)."""
        self._enqueue(DeviceCopyDone(task, indices, error))

    def _after_device(self, trip: PartitionTrip, event: Any) -> None:
        """Move ``trip`` on once the GPU has passed ``event`` (the copy waiter reports it)."""
        trip.task.device.staging.waiter.put(
            (event, trip, (), lambda _, __, error: self._enqueue(StageDone(trip, error))))

    def barrier(self, timeout_s: float) -> None:
        """Block until every worker has entered the barrier; raises the job's failure if any."""
        request = BarrierRequest()
        if self._fatal is not None or not self.is_alive():
            raise self._fatal or TransportError("the worker's communication thread is not running")
        self._enqueue(request)
        if not request.done.wait(timeout_s):
            raise TransportError(f"barrier: the other workers did not arrive within {timeout_s:g} s")
        if request.error is not None:
            raise request.error

    def join_job(self) -> int:
        """hvd.join(): block until every worker joined, serving the others' rounds with zeros meanwhile;
        returns the rank whose join completed the barrier (the last to join)."""
        request = JoinRequest()
        if self._fatal is not None or not self.is_alive():
            raise self._fatal or TransportError("the worker's communication thread is not running")
        self._enqueue(request)
        while not request.done.wait(1.0):  # as long as the others train: a dead node fails it
            pass
        if request.error is not None:
            raise request.error
        return request.last

    def _enqueue(self, item: Union[PushPullTask, BarrierRequest, DeviceCopyDone, StageDone]) -> None:
        self._tasks.put(item)
        if not self._wake_pending:
            self._wake_pending = True
            os.write(self._wake_write, b"t")

    def set_tracer(self, tracer: Any) -> None:
        """Trace from now on into ``tracer`` (None: stop); the comm thread picks it up at its next event."""
        self.tracer = tracer
        self.dispatcher.set_tracer(tracer)

    def stop(self, linger_ms: Optional[int] = None) -> None:
        """Ask the thread to finish; in-flight tasks fail if it must cut them off.

        ``linger_ms`` bounds how long unsent messages to the servers are kept trying (0: drop them, for a
        worker leaving a broken job).
        """
        self._tasks.put(None)
        os.write(self._wake_write, b"s")
        self.join()
        if self.compression is not None:
            self.compression.close()
        if self.exchange is not None:
            self.exchange.close(linger_ms)
        if self.local is not None:
            self.local.close()
        os.close(self._wake_read)
        os.close(self._wake_write)

    @property
    def bytes_sent(self) -> int:
        return self.exchange.bytes_sent if self.exchange else 0

    @property
    def bytes_received(self) -> int:
        return self.exchange.bytes_received if self.exchange else 0

    @property
    def shared_payloads(self) -> int:
        return self.exchange.shared_payloads if self.exchange else 0

    @property
    def rdma_payloads(self) -> int:
        return self.exchange.rdma_payloads if self.exchange else 0

    # --- the thread ---------------------------------------------------------------
    def run(self) -> None:
        poller = Poller()
        poller.register(self._wake_read)
        for connection in self.connections:
            poller.register(connection)
        scheduler = self.scheduler.connection if self.scheduler else None
        if scheduler is not None:
            poller.register(scheduler)
        inbox = self.local.inbox if self.local else None
        if inbox is not None:
            poller.register(inbox)
        try:
            while self.local is not None and self.local.channel.has_early:
                self.local.receive()  # sent by faster local ranks while this one authenticated
            next_check = time.monotonic() + _JOB_CHECK_S
            while not self._stopping:
                wait_s = self.scheduler.pulse() if self.scheduler else None
                if self.options.job_over is not None:
                    now = time.monotonic()
                    if now >= next_check:
                        next_check = now + _JOB_CHECK_S
                        reason = self.options.job_over()
                        if reason is not None:
                            raise NodeFailure(reason)
                    wait_s = min(wait_s if wait_s is not None else _JOB_CHECK_S, max(0.0, next_check - now))
                for ready in poller.poll(wait_s):
                    if ready is self._wake_read:
                        os.read(self._wake_read, 4096)
                        self._wake_pending = False  # before draining, so no submit goes unseen
                        self._start_queued_tasks()
                    elif ready is scheduler:
                        self._receive_from_scheduler()
                    elif ready is inbox:
                        self.local.receive()
                        self._maybe_finish_join()
                    else:
                        self.exchange.receive(ready)
        except NodeFailure as exc:
            log.error("%s", exc)
            self._fail_all(exc, tell_servers=False)
        except BaseException as exc:  # the thread must never die silently
            log.exception("communication thread failed")
            self._fail_all(exc)
        finally:
            self._fail_all(TransportError("the worker was shut down with this push_pull in flight"))

    def _receive_from_scheduler(self) -> None:
        message = self.scheduler.recv()  # raises NodeFailure when the scheduler reports a dead node
        if message.header.command == Command.BARRIER_RELEASE and self._barriers:
            request = self._barriers.pop(0)
            if isinstance(request, JoinRequest):
                request.released, request.last = True, message.header.key
                self._maybe_finish_join()
            else:
                request.done.set()
        elif message.header.command != Command.HEARTBEAT:
            log.error("unexpected %s from the scheduler", command_name(message.header.command))

    def _start_queued_tasks(self) -> None:
        while True:
            try:
                task = self._tasks.get_nowait()
            except queue.Empty:
                return
            if task is None:
                self._stopping = True
                return
            if isinstance(task, DeviceCopyDone):
                self._device_copy_arrived(task)
            elif isinstance(task, StageDone):
                self._stage_done(task)
            elif isinstance(task, JoinRequest):
                self._join = task
                self._maybe_start_join()
            elif isinstance(task, BarrierRequest):
                self.scheduler.connection.send(Command.BARRIER, self.rank, aux=BARRIER_WORKERS)
                self._barriers.append(task)
            else:
                self._start(task)

    def _start(self, task: PushPullTask) -> None:
        parts = task.plan.partitions
        task.remaining = len(parts)
        if task.remaining == 0:
            task.handle.set_done()
            return
        self._active[id(task)] = task
        tracer = self.tracer
        if tracer is not None and tracer.traces(task.round):
            task.started = time.time()
        local_members = self._local_members(task)
        aggregates = self.local is not None and len(local_members) > 1
        if aggregates and not self.local.prepare(task):
            return
        has_servers = self.exchange is not None and self._spans_machines(task)
        routes = [plan_route(self.local.root_of(task.plan.tensor_id, part, local_members) == self.options.local_rank
                             if aggregates else None, has_servers, task.compression is not None, task.skipped,
                             task.device is not None, summed_on_gpu(task))
                  for part in parts]
        task.network_partitions = sum(Stage.PUSH in route for route in routes)
        for part, route in zip(parts, routes):
            self.dispatcher.proceed(PartitionTrip(task, part, route))

    # --- join -------------------------------------------------------------------------------
    def _maybe_start_join(self) -> None:
        """Start a requested join once this worker's own tasks are all done: its JOIN (to the servers)
        or LOCAL_JOINED (to its peers) must follow its last push or LOCAL_READY."""
        request = self._join
        if request is None or request.started or self._active or self._fatal is not None:
            return
        request.started = True
        if self.local is not None:
            self.local.join()
        if self.exchange is not None:
            self.exchange.send_join()
        self.scheduler.connection.send(Command.BARRIER, self.rank, aux=BARRIER_WORKERS)
        self._barriers.append(request)

    def _maybe_finish_join(self) -> None:
        request = self._join
        if request is None or not request.released or (self.local is not None and not self.local.all_joined):
            return
        if self.local is not None:
            self.local.end_join()
        self._join = None
        request.done.set()

    def _local_members(self, task: PushPullTask) -> Tuple[int, ...]:
        """The local ranks of this machine that take part in ``task`` (this one alone without local peers)."""
        return self.local.members_of(task) if self.local is not None else (0,)

    def _spans_machines(self, task: PushPullTask) -> bool:
        """Whether ``task``'s ranks live on more than one machine (else the local sum is the result)."""
        return task.members is None or task.machines > 1

    # --- the stages owned here ------------------------------------------------------------
    def _copy_out(self, trip: PartitionTrip) -> None:
        """COPY_OUT: the result into the output, divided when averaging; nothing if it landed there (or if
        the partition was pulled bare: the output stays as it is)."""
        target, task = trip.output, trip.task
        if task.keep_output and trip.part.inside(task.keep_output):
            self.dispatcher.proceed(trip)  # e.g. a gather's own rows, summed with local peers' zeros
            return
        # A bare pull's data is the output itself; a compressed tensor was averaged before it was pushed.
        if task.average_over > 1 and task.compression is None and trip.pull_nbytes:
            kernels.scale_into(target, trip.data, task.output.dtype, task.average_over)
            self.copied_out += trip.part.nbytes
        elif trip.data is not target:
            target[:] = trip.data
            self.copied_out += trip.part.nbytes
        self.dispatcher.proceed(trip)

    def _device_to_host(self, trip: PartitionTrip) -> None:
        """DEVICE_TO_HOST: on as soon as the partition's copy is done (now, or when the waiter says so)."""
        staged, index = trip.task.device, trip.part.index
        if staged.ready[index]:
            self.dispatcher.proceed(trip)
        else:
            staged.waiting[index] = trip

    def _stage_done(self, done: StageDone) -> None:
        task = done.trip.task
        if task.failed:
            return
        if done.error is not None:
            self._fail_task(task, done.error)
            return
        self.dispatcher.proceed(done.trip)

    def _device_copy_arrived(self, done: DeviceCopyDone) -> None:
        task = done.task
        if task.failed:
            return
        if done.error is not None:
            self._fail_task(task, done.error)
            return
        staged = task.device
        for index in done.indices:
            staged.ready[index] = True
            trip = staged.waiting.pop(index, None)
            if trip is not None:
                self.dispatcher.resume(trip)  # its stage (DEVICE_TO_HOST, DEVICE_COPY_IN) sees the copy done

    def _host_to_device(self, trip: PartitionTrip) -> None:
        """HOST_TO_DEVICE: the partition's result queued to the device (after the last, handed to the consumer)."""
        trip.task.device.copy_back(trip.part.index)
        self.dispatcher.proceed(trip)

    def _arrived(self, trip: PartitionTrip) -> None:
        task = trip.task
        task.remaining -= 1
        if task.remaining == 0:
            self._active.pop(id(task), None)
            if task.started and self.tracer is not None:
                self.tracer.span("tensor", task.name, task.started, time.time(), step=task.round + 1,
                                         partitions=len(task.plan.partitions), nbytes=task.plan.nbytes)
            task.handle.rounds_closed_after = task.closed_after
            task.handle.set_done()
            self._maybe_start_join()

    # --- failures -------------------------------------------------------------------
    def _fail_key(self, key: int, round_: int, error: BaseException) -> None:
        """A server refused ``key``: fail the tasks that use it (all, for key 0)."""
        failed = [t for t in self._active.values()
                  if key == 0 or any(p.key == key for p in t.plan.partitions)]
        if not failed:
            raise error
        for task in failed:
            self._fail_task(task, error, True, tell_servers=False)

    def _fail_task(self, task: PushPullTask, error: BaseException, tell_peers: bool = True,
                   tell_servers: bool = True) -> None:
        """Fail ``task`` here, and where others wait on it: this machine's other ranks (``tell_peers``)
        and, for a failure found on this machine, the servers, which fail the round on the other machines."""
        if self._active.pop(id(task), None) is None:
            return  # finished or failed already
        task.remaining = -1  # nothing more completes it
        task.failed = True
        if self.exchange is not None:
            self.exchange.abandon(task)
            if tell_servers and self._spans_machines(task):
                members = self._local_members(task)
                mine = [part for part in task.plan.partitions if self.local is None
                        or self.local.root_of(task.plan.tensor_id, part, members) == self.local.local_rank]
                self.exchange.report_failure(task, mine, error)
        if self.local is not None:
            self.local.abandon(task)
            if tell_peers:
                self.local.tell_peers(task, error)
        task.handle.set_error(error)
        self._maybe_start_join()

    def _fail_all(self, error: BaseException, tell_servers: bool = True) -> None:
        """Fail every task in flight with JobLost. ``tell_servers=False`` for a lost node: every other worker
        learns of it from its own scheduler, as JobLost, where the servers' relay would reach it as a plain
        refusal (PushPullError) and end an elastic worker that should roll back."""
        if not isinstance(error, JobLost):  # whatever ended the thread broke the job for every push_pull
            lost = JobLost(str(error))
            lost.__cause__ = error
            error = lost
        if self._fatal is None:
            self._fatal = error
        for task in list(self._active.values()):
            self._fail_task(task, error, tell_peers=False, tell_servers=tell_servers)
        for barrier in self._barriers:
            barrier.fail(error)
        self._barriers.clear()
        if self._join is not None:
            self._join.fail(error)
            self._join = None
        while True:
            try:
                task = self._tasks.get_nowait()
            except queue.Empty:
                break
            if isinstance(task, BarrierRequest):
                task.fail(error)
            elif isinstance(task, PushPullTask):
                task.handle.set_error(error)
