"""The engine of one worker process: its stage owners, its dispatcher, its tasks, put together.

:class:`Engine` is built once per worker from :class:`EngineOptions` and the
servers' addresses. It owns the stage owners (the server exchange, the
local group, the device stages, the codecs, copy-out, the row-sparse
exchange), the
:class:`~byteps.common.engine.dispatcher.Dispatcher` that runs them, the
table of tasks in flight, the failure fan-out and the join. Everything it
does runs on the communication thread (:mod:`byteps.common.engine.loop`),
which calls :meth:`start` for each new task (:meth:`start_sparse` for a
row-sparse one) and the ``receive_*`` methods
when a connection has a message.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, List, Optional, Tuple

from byteps.common.engine.compress import CompressionStages
from byteps.common.engine.copy_out import CopyOut
from byteps.common.engine.device import DeviceCopyDone, DeviceStages, placement_of
from byteps.common.engine.dispatcher import Dispatcher, StageDone
from byteps.common.engine.exchange import ServerExchange
from byteps.common.engine.failures import Failures
from byteps.common.engine.local import LocalGroup
from byteps.common.engine.route import Role, plan_route
from byteps.common.engine.sparse_exchange import SparseExchange
from byteps.common.engine.sparse_local import SparseLocal
from byteps.common.engine.sparse_task import SparseTask, trips_of
from byteps.common.engine.stage import TaskFailed
from byteps.common.engine.task import PartitionTrip, PushPullTask
from byteps.common.engine.task_table import TaskTable
from byteps.transport import Context

__all__ = ["Engine", "EngineOptions"]


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """What the engine needs to know about the job (from Config and the address book)."""

    rank: int
    max_payload_bytes: int
    partition_bytes: int  # BYTEPS_PARTITION_BYTES (a joined root's stand-in re-cuts a tensor with it)
    credit_bytes: int = 0  # 0: unbounded
    pipeline: bool = True
    job_id: str = ""
    machine: int = 0  # DMLC_WORKER_ID
    local_rank: int = 0
    local_size: int = 1
    size: int = 1  # every worker process of the job (a joined local root's row-sparse stand-in averages by it)
    secret: Optional[bytes] = dataclasses.field(default=None, repr=False)  # authenticates local ranks too
    handshake_timeout_s: float = 120.0
    tracer: Any = None  # byteps.common.tracing.Tracer while BYTEPS_TRACE_ON=1
    compress_threads: int = 0  # BYTEPS_THREADPOOL_SIZE: codecs on a pool of threads (0: on this thread)
    quorum: int = 0  # backup workers: the machines that close an average's round (0: all)
    #: Asked about once a second: why the job is over, or None. An elastic worker's says when bpslaunch has
    #: ended its membership epoch, which a dead scheduler could not tell it.
    job_over: Optional[Callable[[], Optional[str]]] = None


class Engine:
    """One worker's stage owners and dispatcher; ``post(item)`` puts an item on the communication thread's
    queue from another thread (a codec done on the pool, a GPU event passed)."""

    def __init__(self, context: Context, servers: List[Tuple[str, int]], options: EngineOptions,
                 post: Callable[[Any], None]) -> None:
        self.options = options
        self.tasks = TaskTable(options.tracer)
        self.exchange: Optional[ServerExchange] = None
        if servers:
            self.exchange = ServerExchange(context, servers, options.rank, options.max_payload_bytes,
                                           options.credit_bytes, options.pipeline, alone=options.local_size == 1)
        self.local: Optional[LocalGroup] = None
        if options.local_size > 1:
            self.local = LocalGroup(context, options.job_id, options.machine, options.local_rank,
                                    options.local_size, options.partition_bytes, options.secret,
                                    options.handshake_timeout_s, len(servers), options.quorum)
        # Row-sparse push_pulls: their own stages over the same server connections (docs/sparse.md), and with
        # several processes per machine a local sum by id before them, over the local channel
        self.sparse: Optional[SparseExchange] = None
        if self.exchange is not None:
            self.sparse = self.exchange.sparse = SparseExchange(self.exchange.connections, options.rank)
        self.sparse_local: Optional[SparseLocal] = None
        if self.local is not None:
            self.sparse_local = self.local.sparse = SparseLocal(self.local.channel, options.local_rank,
                                                                options.local_size, len(servers),
                                                                options.max_payload_bytes, options.size,
                                                                self.local.joins)
        self.device = DeviceStages(self.local)
        self.copy_out = CopyOut()
        owners: List[Any] = [self.copy_out, self.device]
        if self.exchange is not None:
            owners += [self.exchange, CompressionStages(), self.sparse]
        if self.local is not None:
            owners += [self.local, self.sparse_local]
        self.failures = Failures(self.tasks, self.exchange, self.local, self.sparse, self.sparse_local)
        self.dispatcher = Dispatcher(owners, self.tasks.arrived, self.failures, post, options.compress_threads,
                                     options.tracer, self.tasks)

    def set_tracer(self, tracer: Any) -> None:
        self.tasks.tracer = tracer
        self.dispatcher.set_tracer(tracer)

    def start(self, task: PushPullTask) -> None:
        """Plan each partition's route and start the trips."""
        parts = task.plan.partitions
        if not parts:
            task.handle.set_done()
            return
        local = self.local
        members = local.members_of(task) if local is not None else (0,)
        aggregates = len(members) > 1
        servers = self.exchange is not None and task.spans_machines()
        compressed = servers and task.compression is not None
        placement = placement_of(task)
        if aggregates:
            tensor_id, mine = task.plan.tensor_id, local.local_rank
            trips = [PartitionTrip(task, part, plan_route(
                Role.ROOT if local.root_of(tensor_id, part, members) == mine else Role.PEER,
                servers, compressed, placement)) for part in parts]
        else:
            route = plan_route(Role.ALONE, servers, compressed, placement)
            trips = [PartitionTrip(task, part, route) for part in parts]
        self.tasks.add(task, trips)
        if aggregates:
            try:
                local.prepare(task)
            except TaskFailed as failed:
                self.failures.fail_task(task, failed.error, failed.tell_peers)
                return
        for trip in trips:
            self.dispatcher.advance(trip)

    def start_sparse(self, task: SparseTask) -> None:
        """Start a row-sparse task's trips (one per server; a local rank other than the table's root: one); a
        task refused on this rank only fails its round where the other ranks wait for it."""
        trips = trips_of(task, self.exchange is not None)
        self.tasks.add(task, trips)
        if task.refusal is not None:
            self.failures.fail_task(task, task.refusal)
            return
        for trip in trips:
            self.dispatcher.advance(trip)

    # --- events -------------------------------------------------------------------------
    def receive_from_server(self, connection: Any) -> None:
        self.dispatcher.handle(self.exchange.receive(connection))

    def receive_from_peers(self) -> None:
        self.dispatcher.handle(self.local.receive())

    def copies_arrived(self, done: DeviceCopyDone) -> None:
        self.dispatcher.handle(self.device.copies_arrived(done))

    def stage_done(self, done: StageDone) -> None:
        self.dispatcher.finished_elsewhere(done)

    # --- what the worker reads ----------------------------------------------------------
    @property
    def connections(self) -> list:
        return self.exchange.connections if self.exchange is not None else []

    @property
    def has_servers(self) -> bool:
        return self.exchange is not None

    def counter(self, name: str) -> int:
        """One of the server exchange's byte and payload counters (bytes_sent, bytes_received,
        shared_payloads, rdma_payloads); 0 without servers."""
        return getattr(self.exchange, name) if self.exchange is not None else 0

    def close(self, linger_ms: Optional[int] = None) -> None:
        self.dispatcher.close()
        if self.exchange is not None:
            self.exchange.close(linger_ms)
        if self.local is not None:
            self.local.close()
