"""The framework-neutral worker: declare tensors, push_pull them.

A :class:`Worker` is one training process's view of the job. In a
distributed job it registers with the scheduler, connects to every server
and starts the communication thread (:mod:`byteps.common.engine`); with a
single worker process (and BYTEPS_FORCE_DISTRIBUTED unset) it needs neither
scheduler nor server, as in BytePS, and push_pull is a local copy.

Tensor ids come from declaration order, as in BytePS
(:mod:`byteps.common.tensor_registry`). Servers check each partition's
name, size and dtype, so a worker that diverges gets an error naming both
sides instead of a silently wrong sum.

Example::

    worker = Worker(Config.from_env())
    grad = numpy.ones(1000, dtype=numpy.float32)
    worker.push_pull(grad, "layer0.weight", PushPullOptions(average=True))   # in place
    worker.shutdown()
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from byteps.common.compression import CompressionSpec
from byteps.common.config import Config
from byteps.common.engine import CommLoop, EngineOptions, TaskMaker
from byteps.common.engine.sparse_task import SparseTasks
from byteps.common.handle import Handle
from byteps.common.held_table import LOAD, SAVE, HeldTable
from byteps.common.job_report import ProcessReport, write_report
from byteps.common.join_agreement import agree_after_join
from byteps.common.options import DEFAULT_OPTIONS, PushPullOptions
from byteps.common.row_sparse import SparseRows
from byteps.common.server_assignment import ServerAssigner
from byteps.common.tensor_registry import TensorRegistry
from byteps.common.tracing import WORKER_TRACKS, Tracer, clock_metadata, worker_trace_path
from byteps.transport import Context, NodeInfo, SchedulerClient, TransportError, authenticate
from byteps.transport.addressing import resolve_host

__all__ = ["Worker"]

log = logging.getLogger("byteps.common.worker")


class Worker:
    """One worker process of a byteps job."""

    def __init__(self, config: Config, job_over: Optional[Callable[[], Optional[str]]] = None) -> None:
        """Join ``config``'s job. ``job_over``: asked about once a second, the reason the job is over or None
        (an elastic worker's says when bpslaunch ended its membership epoch)."""
        if config.role != "worker":
            raise ValueError(f"a Worker needs DMLC_ROLE=worker, this process has DMLC_ROLE={config.role}")
        self.config = config
        self._lock = threading.Lock()
        self._skipping = threading.local()  # skipping_round() on this thread
        self._closed = False
        self._context: Optional[Context] = None
        self._scheduler: Optional[SchedulerClient] = None
        self._comm: Optional[CommLoop] = None
        self._tracer: Optional[Tracer] = None  # BYTEPS_TRACE_ON=1 in a distributed job
        self._timeline: Optional[Tracer] = None  # start_timeline() .. stop_timeline()
        self.job_id: Optional[str] = config.job_id
        self._started = time.monotonic()
        self.rank, self.size = config.rank, config.size
        #: The scheduler's word (BYTEPS_SHUTDOWN_LEAVES_JOB): the frameworks' shutdown() leaves the job.
        self.shutdown_leaves_job = False
        servers: List[Tuple[str, int]] = []
        if config.is_distributed:
            servers = self._connect(job_over)
        # Without servers (one machine) partitions are still planned: the local ranks sum them one by one.
        self.registry = TensorRegistry(ServerAssigner(max(1, len(servers)), config.partition_bytes,
                                                      config.server_assignment, config.key_hash_fn)
                                       if self._comm is not None else None)
        has_servers = self._comm is not None and self._comm.engine.has_servers
        # Row-sparse push_pulls: through the servers, the machine's ranks summing their rows first; on one
        # machine without servers the local ranks' sum is the result; a lone process makes its own.
        sparse_submit = self._comm.submit if self._comm is not None and (has_servers or config.local_size > 1) \
            else None
        self.sparse = SparseTasks(len(servers) if has_servers else 0, self.size, config.max_partition_bytes,
                                  sparse_submit, config.local_rank, config.local_size, config.enable_async)
        self.tasks = TaskMaker(config, self.registry, self.rank, self.size, has_servers,
                               self._comm.post if self._comm is not None else None)
        if self._comm is not None:
            self._comm.start()
            log.info("worker rank %d of %d connected to %d server(s), %d local process(es)",
                     self.rank, self.size, len(servers), config.local_size)

    @property
    def local_rank(self) -> int:
        return self.config.local_rank

    @property
    def local_size(self) -> int:
        return self.config.local_size

    @property
    def is_distributed(self) -> bool:
        return self._comm is not None

    def _connect(self, job_over: Optional[Callable[[], Optional[str]]]) -> List[Tuple[str, int]]:
        cfg = self.config
        self._context = cfg.transport_context()
        if cfg.trace_on:  # before rendezvous: a bad BYTEPS_TRACE_DIR fails at once, on its own
            self._tracer = Tracer(worker_trace_path(cfg.trace_dir, cfg.worker_id, cfg.num_worker, cfg.local_rank),
                                  f"worker {cfg.rank}", cfg.rank, WORKER_TRACKS, cfg.trace_start_step,
                                  cfg.trace_end_step)
        host = resolve_host(cfg.node_host, cfg.interface, cfg.root_uri)
        self._scheduler = SchedulerClient(self._context, cfg.root_uri, cfg.root_port, cfg.rendezvous_timeout,
                                          cfg.heartbeat_interval_s, cfg.heartbeat_timeout_s, cfg.secret)
        book = self._scheduler.register(
            NodeInfo(role="worker", host=host, worker_id=cfg.worker_id,
                     local_rank=cfg.local_rank, local_size=cfg.local_size, settings=cfg.job_settings()))
        self.rank, self.size = book.rank, book.num_workers
        self.job_id = cfg.job_id or book.job_id
        self.shutdown_leaves_job = book.shutdown_leaves
        if cfg.local_size > 1 and not self.job_id:
            raise TransportError("the scheduler sent no job id (an older byteps-transport?): "
                                 "set BYTEPS_JOB_ID to the same value on every process of the job")
        servers = list(book.servers)
        options = EngineOptions(
            rank=self.rank, max_payload_bytes=cfg.max_partition_bytes, partition_bytes=cfg.partition_bytes,
            credit_bytes=cfg.scheduling_credit * cfg.partition_bytes, pipeline=cfg.pipeline, job_id=self.job_id,
            machine=cfg.worker_id, local_rank=cfg.local_rank, local_size=cfg.local_size, size=self.size,
            secret=cfg.secret,
            handshake_timeout_s=cfg.rendezvous_timeout, tracer=self._tracer, job_over=job_over,
            compress_threads=cfg.threadpool_size,
            quorum=cfg.num_worker - cfg.backup_workers if cfg.backup_workers and servers else 0)
        # From here on the comm thread owns the scheduler connection (heartbeats, barriers).
        self._comm = CommLoop(self._context, servers, options, self._scheduler)
        if cfg.secret is not None:
            for connection in self._comm.connections:
                authenticate(connection, cfg.secret, self.rank, cfg.rendezvous_timeout)
        return servers

    def declare(self, name: str, nbytes: Optional[int] = None, itemsize: Optional[int] = None) -> int:
        """Give ``name`` the next tensor id (idempotent); returns the id.

        With its size (``nbytes`` of ``itemsize``-byte elements) the tensor's
        partitions are placed on the servers now, byte-balanced in declaration
        order (see :mod:`byteps.common.server_assignment`); without, they are
        placed by key hash at the first push_pull.
        """
        return self.registry.declare(name, nbytes, itemsize)

    def push_pull_async(self, tensor: Any, name: str, options: PushPullOptions = DEFAULT_OPTIONS) -> Handle:
        """Start summing (or averaging) ``tensor`` over the workers, as ``options`` say
        (:class:`~byteps.common.options.PushPullOptions`).

        The result goes into ``options.output`` (default: ``tensor`` itself, in
        place); neither may be touched until the handle is done. A CUDA tensor
        (DLPack, e.g. torch's) goes through pinned host memory partition by
        partition (docs/gpu.md), and with local peers is summed on the GPU
        unless BYTEPS_GPU_LOCAL_AGGREGATION=0, it is compressed, a process
        set's, bfloat16, or closed by backup workers. Inside
        :meth:`skipping_round` the round is pulled without a push.
        """
        task, handle = self.tasks.make(tensor, name, options, getattr(self._skipping, "on", False))
        if task is not None:
            self._comm.submit(task)
        return handle

    def push_pull(self, tensor: Any, name: str, options: PushPullOptions = DEFAULT_OPTIONS) -> Any:
        """Synchronous push_pull; returns the output array."""
        return self.push_pull_async(tensor, name, options).wait()

    def sparse_push_pull_async(self, ids: Any, rows: Any, table: str, num_rows: int, row_shape: Sequence[int],
                               average: bool = False, dtype: Any = None) -> Handle:
        """Start a row-sparse push_pull of ``table`` (``num_rows`` rows of shape ``row_shape``): this rank's
        gradient is ``rows[i]`` for row ``ids[i]`` (rows of one id are summed). The handle's ``wait()``
        returns the round's :class:`~byteps.common.row_sparse.SparseRows` over every worker: the union of
        their ids, ascending, and each id's rows summed (divided by the number of workers if ``average``).

        ValueError on this rank for bad input (ids out of range, another dtype or row shape than the
        table's first use...); the round then fails on the other ranks too. ``dtype``: the rows' dtype where
        their array does not say it: ``"bfloat16"`` over 16-bit storage (numpy has no bfloat16; ml_dtypes'
        is recognised), the result's rows then in uint16 storage. docs/sparse.md has the design::

            ids, rows = worker.sparse_push_pull(np.array([7, 3, 7]), grads, "emb", 10_000, (16,))
        """
        return self.sparse.make(ids, rows, table, num_rows, row_shape, average, dtype)

    def sparse_push_pull(self, ids: Any, rows: Any, table: str, num_rows: int, row_shape: Sequence[int],
                         average: bool = False, dtype: Any = None) -> SparseRows:
        """Synchronous :meth:`sparse_push_pull_async`; returns ``SparseRows`` (unpacks as ``ids, rows``)."""
        return self.sparse_push_pull_async(ids, rows, table, num_rows, row_shape, average, dtype).wait()

    def table_lookup_async(self, ids: Any, table: str, num_rows: int, row_shape: Sequence[int],
                           held: HeldTable) -> Handle:
        """Start looking up rows ``ids`` (any order, repeats allowed) of the table ``table`` held by the
        servers (docs/sparse.md, "Tables held by the servers"); the handle's ``wait()`` returns a
        :class:`~byteps.common.row_sparse.SparseRows` of ``ids`` and their rows, float32 of shape
        ``(len(ids), *row_shape)`` (:meth:`table_lookup`: the rows). Rows never touched start as
        :func:`~byteps.common.held_table.initial_rows` makes them. Every rank declares the table alike
        (``num_rows``, ``row_shape``, ``held``); ValueError on this rank for bad input::

            held = HeldTable(optimizer="adagrad", lr=0.05, seed=1)
            rows = worker.table_lookup(np.array([7, 3, 7]), "emb", 10_000_000, (16,), held)
        """
        return self.sparse.lookup(ids, table, num_rows, row_shape, held)

    def table_lookup(self, ids: Any, table: str, num_rows: int, row_shape: Sequence[int],
                     held: HeldTable) -> np.ndarray:
        """Synchronous :meth:`table_lookup_async`."""
        return self.table_lookup_async(ids, table, num_rows, row_shape, held).wait().rows

    def table_update_async(self, ids: Any, grads: Any, table: str, num_rows: int, row_shape: Sequence[int],
                           held: HeldTable, average: bool = True) -> Handle:
        """Start this round's update of the server-held table ``table``: this rank's gradient is ``grads[i]``
        (float32) for row ``ids[i]`` (rows of one id are summed). Once every worker pushed the round, each
        server sums the rows it holds by id (divided by the number of workers if ``average``) and applies
        the table's optimizer to them once; the handle is done when every server has. Every rank updates each
        round (possibly with no rows), as with :meth:`sparse_push_pull_async`."""
        return self.sparse.make(ids, grads, table, num_rows, row_shape, average, None, held)

    def table_update(self, ids: Any, grads: Any, table: str, num_rows: int, row_shape: Sequence[int],
                     held: HeldTable, average: bool = True) -> None:
        """Synchronous :meth:`table_update_async`."""
        self.table_update_async(ids, grads, table, num_rows, row_shape, held, average).wait()

    def table_save(self, directory: str, table: str, num_rows: int, row_shape: Sequence[int],
                   held: HeldTable) -> None:
        """Every server writes its shard of the held table ``table`` (rows, optimizer state, settings) to
        ``directory`` on its own file system, as ``held_table.shard_file`` names it. Call it on one rank, between
        rounds (the rounds applied so far are saved)."""
        self.sparse.control(SAVE, directory, table, num_rows, row_shape, held).wait()

    def table_load(self, directory: str, table: str, num_rows: int, row_shape: Sequence[int],
                   held: HeldTable) -> None:
        """Every server replaces its shard of the held table ``table`` with the rows it owns among the shards
        saved in ``directory`` by any number of servers (each reads them all). Call it on one rank, before the
        others look the table up again (a barrier)."""
        self.sparse.control(LOAD, directory, table, num_rows, row_shape, held).wait()

    def announce_layout(self, name: str, layout: str, set_id: int = 0) -> bool:
        """Tell the other ranks (of process set ``set_id``; 0: every rank), in a round of ``name`` that
        carries no data, that this rank now uses the name's user-level name with ``layout`` (a text every
        rank writes alike), and wait for the round.

        Adapters give each (shape, dtype) a name is used with a tensor of its
        own (:mod:`byteps.common.frontend.names`); a rank that switches to
        another one announces it on the tensor of the name's last use, where
        the other ranks push that round too. The round fails on every rank
        (PushPullError naming both uses) unless all of them announce the
        same layout, instead of each rank waiting on its own tensor for ever.
        Returns False where nothing was announced: ``name`` has no earlier
        push_pull of its own in the set from host memory here (a fused
        bucket's member has none), or one whose rounds cannot carry a notice
        (compressed, asynchronous, backup workers' quorum rounds).
        """
        last = self.tasks.last_use(name, set_id)
        if last is None:
            return False
        self.registry.wait_idle(last.tensor)
        self.push_pull(np.zeros(last.shape, last.dtype), name,
                       last.options.replace(notice=layout, nonzero=None, skip_pull=(), stream=None))
        return True

    @contextlib.contextmanager
    def skipping_round(self) -> Iterator[None]:
        """Backup workers: the push_pulls this thread starts inside pull their round's sum without pushing.

        For a worker that learnt it is behind (:meth:`take_rounds_behind`):
        the round has closed without it, so instead of computing its
        gradients it takes the round's averages, as the others did, and
        goes on with the next round. Each push_pull must be an average over
        every worker of a round that has closed (the server refuses others).
        With several worker processes per machine the machine is what is
        late: every local rank learns the same rounds behind (from the root's
        answers) and must skip the same rounds.
        """
        self._skipping.on = True
        try:
            yield
        finally:
            self._skipping.on = False

    def take_rounds_behind(self) -> int:
        """Backup workers: how many rounds had closed after this worker's rounds, the least over the
        push_pulls finished since the last call (0 without backup workers, or when none told). A worker
        more than 0 behind may skip that many rounds (:meth:`skipping_round`) instead of computing them."""
        return self.registry.take_rounds_behind()

    def compresses(self, nbytes: int, crosses_machines: bool = True,
                   compression: Optional[CompressionSpec] = None) -> bool:
        """Whether a push_pull of ``nbytes`` with compression_params is compressed: it must go through servers
        (between machines) and be at least BYTEPS_MIN_COMPRESS_BYTES, as in BytePS. Adapters ask it too, to
        give the tensors that go uncompressed their momentum after the pull."""
        if compression is not None and compression.compressor == "none":
            return False
        return self.tasks.has_servers and crosses_machines and nbytes >= self.config.min_compress_bytes

    def derived_id(self, name: str, variant: int, set_id: int = 0) -> int:
        """An id for a tensor that belongs to the declared tensor ``name`` (of process set ``set_id``), e.g. a
        collective's buffer of one size class (``variant`` < 64): the same on every rank, whatever the order
        in which ranks start such tensors, and never an id that declaration order gives out."""
        return self.registry.derived_id(self.tasks.name_for(name, closes_early=False), variant, set_id)

    def join(self, extra: Any = None) -> Tuple[int, List[Any]]:
        """Horovod's ``join()``: this rank has no more data. Until every rank has joined, the others' rounds
        count this rank's tensors as zeros (it is waited for by nobody); returns the rank that joined last.

        Ranks then agree again on what the others declared meanwhile (tensor ids, rounds, placements);
        ``extra`` (anything JSON can carry, e.g. the front's name state) is exchanged too: returned are
        the joined-last rank and every rank's ``extra``, in rank order. Works in every layout: one machine,
        servers, several processes per machine (a joined local root stands in for its peers, dense and
        row-sparse alike), backup workers.
        """
        if self._comm is None:
            return self.rank, [extra]
        last = self._comm.join_job()
        return last, agree_after_join(self, extra)

    def start_timeline(self, path: str) -> None:
        """Trace every push_pull of this worker from now on into ``path`` (Horovod's ``start_timeline``)."""
        self.stop_timeline()
        tracer = Tracer(path, f"worker {self.rank}", self.rank, WORKER_TRACKS, 1, 2 ** 62)
        self._timeline = tracer
        if self._comm is not None:  # a single worker process sends nothing: its trace stays empty
            self._comm.set_tracer(tracer)

    def stop_timeline(self) -> Optional[str]:
        """End :meth:`start_timeline`'s trace and write it; BYTEPS_TRACE_ON's goes on. Returns the path."""
        timeline, self._timeline = self._timeline, None
        if timeline is None:
            return None
        if self._comm is not None:
            self._comm.set_tracer(self._tracer)
        return timeline.write({"rank": self.rank, "size": self.size, "window": "start_timeline .. stop_timeline",
                               **self._clock()})

    def _clock(self) -> dict:
        return clock_metadata(self._scheduler.clock if self._scheduler is not None else None)

    def barrier(self) -> None:
        """Block until every worker process reaches the barrier."""
        if self._comm is not None:
            self._comm.barrier(self.config.rendezvous_timeout)

    @property
    def server_addresses(self) -> List[str]:
        """The servers this worker pushes to, as ``tcp://host:port`` (empty when not distributed)."""
        return [c.address for c in self._comm.connections] if self._comm else []

    def _exchange_counter(self, name: str) -> int:
        return self._comm.engine.counter(name) if self._comm is not None else 0

    @property
    def bytes_sent(self) -> int:
        return self._exchange_counter("bytes_sent")

    @property
    def bytes_received(self) -> int:
        return self._exchange_counter("bytes_received")

    @property
    def shared_payloads(self) -> int:
        """Payloads that moved through shared memory to or from a server on this host (BYTEPS_ENABLE_IPC)."""
        return self._exchange_counter("shared_payloads")

    @property
    def rdma_payloads(self) -> int:
        """Payloads that moved by RDMA WRITE to or from a server (DMLC_ENABLE_RDMA)."""
        return self._exchange_counter("rdma_payloads")

    def shutdown(self) -> None:
        """Leave the job: waits for the other workers, then closes every socket."""
        self._leave(goodbye=True)

    def abandon(self) -> None:
        """Leave a broken job at once: no goodbye to the scheduler, nothing unsent kept.

        For a worker that goes on in another job (elastic training after a lost process), where a
        goodbye to a dead scheduler would only wait out the sockets' linger.
        """
        self._leave(goodbye=False)

    def _leave(self, goodbye: bool) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = self.registry.closed = True
        linger_ms = None if goodbye else 0
        if self._comm is not None:
            self._comm.stop(linger_ms)
        self.tasks.close()
        self._write_report()
        self.stop_timeline()
        if self._tracer is not None:
            self._tracer.write({"rank": self.rank, "size": self.size, "local_rank": self.local_rank, **self._clock()})
        if self._scheduler is not None:
            try:
                if goodbye:
                    self._scheduler.finalize()
            finally:
                self._scheduler.close(linger_ms)
        if self._context is not None:
            self._context.close()

    def _write_report(self) -> None:
        first, last = self.registry.first_start, self.registry.last_done
        busy = last - first if first is not None else 0.0
        write_report(self.config.report_dir, ProcessReport(
            "worker", self.rank, time.monotonic() - self._started, self.registry.max_round, max(0.0, busy),
            self.bytes_sent, self.bytes_received, shared_payloads=self.shared_payloads,
            rdma_payloads=self.rdma_payloads))
