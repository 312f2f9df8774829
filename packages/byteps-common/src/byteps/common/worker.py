"""The framework-neutral worker: declare tensors, push_pull them.

A :class:`Worker` is one training process's view of the job. In a
distributed job it registers with the scheduler, connects to every server
and starts the communication thread; with a single worker process (and
BYTEPS_FORCE_DISTRIBUTED unset) it needs neither scheduler nor server, as in
BytePS, and push_pull is a local copy.

Tensor ids come from declaration order, as in BytePS: every worker must
declare (or first push_pull) its tensors in the same order. Servers check
each partition's name, size and dtype, so a worker that diverges gets an
error naming both sides instead of a silently wrong sum.

Example::

    worker = Worker(Config.from_env())
    grad = numpy.ones(1000, dtype=numpy.float32)
    worker.push_pull(grad, name="layer0.weight", average=True)   # in place
    worker.shutdown()
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

import numpy as np

from byteps.common.buffers import input_and_output_views
from byteps.common.comm_loop import CommLoop, CommOptions, PushPullTask
from byteps.common.compression import COMPRESSIBLE_DTYPES, CompressionSpec
from byteps.common.compression.feedback import TensorCompressor
from byteps.common.config import Config
from byteps.common.device_staging import DeviceStaging, device_of
from byteps.common.dtypes import DType
from byteps.common.handle import Handle
from byteps.common.job_report import ProcessReport, write_report
from byteps.common.server_assignment import ServerAssigner
from byteps.common.tensor_description import TAG_GATHER
from byteps.common.tracing import WORKER_TRACKS, Tracer, clock_metadata, worker_trace_path
from byteps.transport import Context, NodeInfo, SchedulerClient, TransportError, authenticate
from byteps.transport.addressing import resolve_host

__all__ = ["Worker"]

log = logging.getLogger("byteps.common.worker")
#: A tensor id is its process set's id above this many bits of the set's own tensor number.
_SET_ID_SHIFT = 32
#: Set-id bit of derived ids (:meth:`Worker.derived_id`); process set ids stay below it.
_DERIVED_SETS = 1 << 15
#: The set id of the worker's own bookkeeping tensors (join's state exchange); no process set gets it.
_RESERVED_SET = _DERIVED_SETS - 1


class Worker:
    """One worker process of a byteps job."""

    def __init__(self, config: Config, job_over: Optional[Callable[[], Optional[str]]] = None) -> None:
        """Join ``config``'s job. ``job_over``: asked about once a second, the reason the job is over or None
        (an elastic worker's says when bpslaunch ended its membership epoch)."""
        if config.role != "worker":
            raise ValueError(f"a Worker needs DMLC_ROLE=worker, this process has DMLC_ROLE={config.role}")
        self.config = config
        self._job_over = job_over
        self._lock = threading.Lock()
        self._tensor_ids: Dict[str, int] = {}
        self._next_ids: Dict[int, int] = {}  # process set id -> its next tensor number
        self._rounds: Dict[str, int] = {}
        self._in_flight: Set[str] = set()
        self._compressors: Dict[str, TensorCompressor] = {}  # compressed tensors' state, kept across rounds
        self._device_staging = DeviceStaging()  # CUDA tensors' pinned buffers (CuPy only once one arrives)
        self._skipping = threading.local()  # skipping_round() on this thread
        self._rounds_behind: Optional[int] = None  # backup workers: see take_rounds_behind()
        self._closed = False
        self._context: Optional[Context] = None
        self._scheduler: Optional[SchedulerClient] = None
        self._comm: Optional[CommLoop] = None
        self._tracer: Optional[Tracer] = None  # BYTEPS_TRACE_ON=1 in a distributed job
        self._timeline: Optional[Tracer] = None  # start_timeline() .. stop_timeline()
        self._assigner: Optional[ServerAssigner] = None
        self.job_id: Optional[str] = config.job_id
        self._started = time.monotonic()
        self._first_push_pull: Optional[float] = None
        self._last_done = 0.0
        self.rank = config.rank
        self.size = config.size
        if config.is_distributed:
            self._connect()

    @property
    def local_rank(self) -> int:
        return self.config.local_rank

    @property
    def local_size(self) -> int:
        return self.config.local_size

    @property
    def is_distributed(self) -> bool:
        return self._comm is not None

    def _connect(self) -> None:
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
        if cfg.local_size > 1 and not self.job_id:
            raise TransportError("the scheduler sent no job id (an older byteps-transport?): "
                                 "set BYTEPS_JOB_ID to the same value on every process of the job")
        options = CommOptions(
            rank=self.rank, max_payload_bytes=max(cfg.partition_bytes, 1 << 20),
            credit_bytes=cfg.scheduling_credit * cfg.partition_bytes, pipeline=cfg.pipeline,
            job_id=self.job_id, machine=cfg.worker_id, local_rank=cfg.local_rank, local_size=cfg.local_size,
            secret=cfg.secret, handshake_timeout_s=cfg.rendezvous_timeout, partition_bytes=cfg.partition_bytes,
            tracer=self._tracer, job_over=self._job_over, compress_threads=cfg.threadpool_size)
        # From here on the comm thread owns the scheduler connection (heartbeats, barriers).
        self._comm = CommLoop(self._context, list(book.servers), options, self._scheduler)
        if cfg.secret is not None:
            for connection in self._comm.connections:
                authenticate(connection, cfg.secret, self.rank, cfg.rendezvous_timeout)
        self._assigner = ServerAssigner(max(1, len(book.servers)), cfg.partition_bytes,
                                        cfg.server_assignment, cfg.key_hash_fn)
        self._comm.start()
        log.info("worker rank %d of %d connected to %d server(s), %d local process(es)",
                 self.rank, self.size, len(book.servers), cfg.local_size)

    def declare(self, name: str, nbytes: Optional[int] = None, itemsize: Optional[int] = None) -> int:
        """Give ``name`` the next tensor id (idempotent); returns the id.

        With its size (``nbytes`` of ``itemsize``-byte elements) the tensor's
        partitions are placed on the servers now, byte-balanced in declaration
        order (see :mod:`byteps.common.server_assignment`); without, they are
        placed by key hash at the first push_pull.
        """
        with self._lock:
            is_new = name not in self._tensor_ids
            tensor_id = self._declare_locked(name)
            if nbytes is not None and self._assigner is not None:
                self._assigner.plan(tensor_id, nbytes, itemsize or 1, balanced=is_new)
            return tensor_id

    def _declare_locked(self, name: str, set_id: int = 0, tensor_id: Optional[int] = None) -> int:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a tensor name must be a non-empty string, got {name!r}")
        if tensor_id is not None:
            known = self._tensor_ids.setdefault(name, tensor_id)
            if known != tensor_id:
                raise ValueError(f"tensor {name!r} has id {known}, not {tensor_id}")
            self._rounds.setdefault(name, 0)
            return tensor_id
        if name not in self._tensor_ids:
            # Each process set numbers its own tensors: ranks outside a set never
            # see its tensors, and must still agree on the numbers of the others.
            number = self._next_ids.get(set_id, 0)
            self._next_ids[set_id] = number + 1
            self._tensor_ids[name] = set_id << _SET_ID_SHIFT | number
            self._rounds[name] = 0
        return self._tensor_ids[name]

    def push_pull_async(self, tensor: Any, name: str, average: bool = True, output: Any = None,
                        dtype: Optional[Union[str, DType]] = None, members: Optional[Sequence[int]] = None,
                        set_id: int = 0, root: Optional[int] = None, tensor_id: Optional[int] = None,
                        joinable: bool = True, compression: Optional[CompressionSpec] = None,
                        lr: Optional[float] = None, asynchronous: bool = False,
                        stream: Optional[int] = None, nonzero: Optional[Tuple[int, int]] = None,
                        segments: Optional[Sequence[int]] = None,
                        skip_pull: Sequence[Tuple[int, int]] = ()) -> Handle:
        """Start summing (or averaging) ``tensor`` over all workers.

        The result goes into ``output`` (default: ``tensor`` itself, in
        place). Neither may be touched until the handle is done. Integers
        average with floor division, like numpy's ``//``.

        ``members`` (global ranks, this one among them) with ``set_id`` (a
        process set's id, above 0) sums over those ranks only: the others
        neither take part nor are waited for. Every member must pass the
        same set; its tensors are numbered apart from every other set's.

        ``root`` marks a broadcast from that rank (the caller pushes zeros
        elsewhere): ranks that name different roots fail, on every rank.

        ``joinable=False`` marks a sum that gathers (each rank's bytes at its
        own offset): while a rank has joined (:meth:`join`), such a round
        fails instead of counting that rank as zeros, as Horovod's allgather
        and broadcast do.

        ``tensor_id`` (from :meth:`derived_id`) gives a new name its id
        instead of the next one in declaration order: such a push_pull may
        be started from any thread at any time, e.g. from a done-callback.

        ``compression`` (BytePS's compression_params, parsed) compresses the
        tensor on its way to the servers when it is at least
        BYTEPS_MIN_COMPRESS_BYTES and crosses machines (:meth:`compresses`);
        ``lr``, the optimizer's learning rate, rescales error feedback.
        ``segments`` (element counts, summing to the tensor's) makes it a
        fused bucket whose members are compressed each alone
        (:func:`byteps.common.fusion.plan_fusion`); it must fit one
        partition.

        ``asynchronous`` (BYTEPS_ENABLE_ASYNC's parameter exchange, docs/async.md): the servers keep the
        tensor. Its first push_pull broadcasts the initial value into their store (``root`` given); each
        later one pushes a delta (a sum, ``average=False``), which the servers add as it comes, and
        returns the store as it stands after this worker's delta.

        ``nonzero`` (byte offsets ``(start, end)``) says the tensor is zero outside that range, as a
        gather's buffer is outside this rank's bytes (and a broadcast's everywhere but on its root):
        partitions outside it are neither copied into shared memory for local peers nor summed there (a
        flag on LOCAL_READY says so), and where this process pushes its tensor alone (one local rank), they
        go to the servers as a header flagged zeros, with no payload.

        ``skip_pull`` (byte ranges ``(start, end)``) says the caller does not need the servers' sum
        there: the output holds it already (a gather's buffer at this rank's own bytes, which the others
        push as zeros, and in its padding), or the caller does not read it (a reducescatter's other rows).
        Uncompressed, from host memory, the output of partitions wholly inside those ranges is left as it
        is (not divided when averaging), and where this process pushes alone (one local rank) they are
        pulled bare: the servers answer with a header once the round is complete. A broadcast's root, in
        place, needs none of its result: it is pulled bare everywhere.

        A CUDA tensor (DLPack, e.g. torch's) goes through pinned host memory partition by partition
        (:mod:`byteps.common.device_staging`, docs/gpu.md); ``stream``, the caller's CUDA stream, waits
        for the result's copies back (None: the handle waits for them on the host). With local peers it is
        summed on the GPU (:mod:`byteps.common.device_local`) unless BYTEPS_GPU_LOCAL_AGGREGATION=0, or
        it is compressed, a process set's, bfloat16, or closed by backup workers.
        """
        what = f"push_pull({name!r})"
        closes_early = self._closes_early(average, members, root, joinable)
        staged = None
        if device_of(tensor, f"{what} input") is not None:
            if asynchronous:
                raise ValueError(f"{what}: asynchronous training (BYTEPS_ENABLE_ASYNC) takes CPU tensors; "
                                 "keep the parameters' copy on the CPU")
            staged = self._device_staging.stage(tensor, output, name, what, dtype, stream,
                                                self._sums_on_gpu(members, compression, closes_early))
            source, target = staged.source, staged.target
        elif output is not None and device_of(output, f"{what} output") is not None:
            raise ValueError(f"{what}: the input is on the CPU but the output on a CUDA device; "
                             "pass both on the same device")
        else:
            source, target = input_and_output_views(tensor, output, what, dtype)
        if compression is not None and compression.compressor != "none" and source.dtype not in COMPRESSIBLE_DTYPES:
            raise ValueError(f"push_pull({name!r}): compression_params {compression.compressor!r} takes float16, "
                             f"float32 or float64 tensors, not {source.dtype.name.lower()}")
        if asynchronous:
            self._check_asynchronous(name, members, compression, average)
        skipped = getattr(self._skipping, "on", False)
        if skipped and not (closes_early and (compression is None or compression.compressor == "none")):
            raise ValueError(f"push_pull({name!r}) in skipping_round(): only an uncompressed average over every "
                             "worker closes without the slowest machines (BYTEPS_BACKUP_WORKERS), so only such a "
                             "round can be skipped")
        ranks, machines = None, 0
        if members is not None:
            ranks = tuple(sorted(int(r) for r in members))
            if self.rank not in ranks or not 0 < set_id < _RESERVED_SET or any(not 0 <= r < self.size for r in ranks):
                raise ValueError(f"push_pull({name!r}): members {list(ranks)} (set {set_id}) must be ranks of this "
                                 f"job including this one ({self.rank}), with a set id in 1..{_RESERVED_SET - 1}")
            machines = len({r // self.local_size for r in ranks})
            name = f"{name} (process set {set_id})"
        with self._lock:
            if self._closed:
                raise RuntimeError("push_pull after shutdown(): call init() again first")
            if name in self._in_flight:
                raise ValueError(
                    f"push_pull({name!r}): a push_pull of this name is still in flight; "
                    "wait for its handle before submitting it again")
            is_new, derived = name not in self._tensor_ids, tensor_id is not None
            tensor_id = self._declare_locked(name, set_id if ranks is not None else 0, tensor_id)
            plan = None
            if self._assigner is not None:  # raises if the size changed: before the round is counted
                # A set's tensors, and tensors with derived ids, are placed by hash: the
                # balanced placement follows the order in which a rank declares tensors,
                # which differs between sets and for tensors started from callbacks.
                plan = self._assigner.plan(tensor_id, source.nbytes, source.dtype.itemsize,
                                           balanced=is_new and ranks is None and not derived)
            round_ = self._rounds[name]
            if asynchronous and (round_ == 0) != (root is not None):
                raise ValueError(f"push_pull({name!r}): an asynchronous tensor's first push_pull broadcasts its "
                                 "initial value (root=...), and only the first")
            self._rounds[name] = round_ + 1
            self._in_flight.add(name)
            if self._first_push_pull is None:
                self._first_push_pull = time.monotonic()
        handle = _TrackedHandle(name, target.array if staged is None else
                                (tensor if output is None else output), self)
        if self._comm is None:
            if staged is not None:
                staged.copy_through()
            elif target.data is not source.data:
                np.copyto(target.data, source.data)
            handle.set_done()
            return handle
        count = self.size if ranks is None else len(ranks)
        compressor = None
        if compression is not None and self.compresses(source.nbytes, ranks is None or machines > 1, compression):
            if segments is not None:
                self._check_segments(name, segments, source, plan)
            compressor = self._compressors.get(name)
            if compressor is None or not compressor.matches(compression, source.dtype, segments):
                compressor = self._compressors[name] = TensorCompressor(compression, source.dtype, segments)
        tag = int(root) + 1 if root is not None else 0 if joinable else TAG_GATHER
        if root is not None and root != self.rank:
            nonzero = (0, 0)  # a broadcast's other ranks push zeros: none of them need to travel
        elif root is not None and not asynchronous and target.data is source.data:
            skip_pull = ((0, source.nbytes),)  # the others push zeros: the root's tensor is the sum
        quorum = 0
        if closes_early:  # averaged over the machines that closed the round
            quorum = self.config.num_worker - self.config.backup_workers
            count = quorum * self.local_size
        kept = self._kept_ranges(skip_pull, compressor, staged, quorum)
        task = PushPullTask(name=name, round=round_, source=source, output=target, plan=plan,
                            average_over=count if average else 0, handle=handle, members=ranks, machines=machines,
                            tag=tag, compression=compressor, lr=lr, asynchronous=asynchronous, quorum=quorum,
                            skipped=skipped, device=staged,
                            nonzero=nonzero if compressor is None else None,
                            skip_pull=kept if self.local_size == 1 else (), keep_output=kept)
        if staged is not None:
            comm = self._comm
            start = staged.start_local if staged.local else staged.start
            start(plan.partitions, lambda _, indices, error: comm.device_copy_done(task, indices, error))
        self._comm.submit(task)
        return handle

    def _sums_on_gpu(self, members: Optional[Sequence[int]], compression: Optional[CompressionSpec],
                     closes_early: bool) -> bool:
        """Whether a CUDA tensor's local aggregation may run on the GPU (same answer on every local rank). Not
        when backup workers close its rounds early, which a skipped round must (checked below)."""
        return (self.config.gpu_local_aggregation and self.local_size > 1 and self._comm is not None
                and members is None and (compression is None or compression.compressor == "none")
                and not closes_early)

    @staticmethod
    def _kept_ranges(ranges: Sequence[Tuple[int, int]], compressor: Any, staged: Any,
                     quorum: int) -> Tuple[Tuple[int, int], ...]:
        """The ranges of ``skip_pull`` whose output stays as it is (COPY_OUT leaves them): uncompressed (no
        error feedback to apply), from host memory, every machine's push awaited. Where this process pushes
        alone they are also pulled bare (with local peers the root's slot must hold the machine's sum)."""
        if not ranges or compressor is not None or staged is not None or quorum:
            return ()
        return tuple((int(start), int(end)) for start, end in ranges)

    @staticmethod
    def _check_segments(name: str, segments: Sequence[int], source: Any, plan: Any) -> None:
        """A compressed bucket's segments: positive element counts that cover it, in one partition."""
        elements = source.nbytes // source.dtype.itemsize
        if any(int(count) < 1 for count in segments) or sum(int(count) for count in segments) != elements:
            raise ValueError(f"push_pull({name!r}): segments {list(segments)} must be positive element counts "
                             f"that add up to the tensor's {elements} elements")
        if plan is not None and len(plan.partitions) > 1:
            raise ValueError(f"push_pull({name!r}): a bucket of compressed segments must fit one partition; its "
                             f"{source.nbytes} bytes are {len(plan.partitions)} partitions of BYTEPS_PARTITION_BYTES")

    def _closes_early(self, average: bool, members: Optional[Sequence[int]], root: Optional[int],
                      joinable: bool) -> bool:
        """Backup workers: whether this push_pull's rounds close once all machines but BYTEPS_BACKUP_WORKERS
        pushed: averages over every worker through the servers (sums, broadcasts, gathers and process sets
        always wait for every rank)."""
        return bool(self.config.backup_workers and average and members is None and root is None and joinable
                    and self._comm is not None and self._comm.exchange is not None)

    def _check_asynchronous(self, name: str, members: Optional[Sequence[int]],
                            compression: Optional[CompressionSpec], average: bool) -> None:
        if self._comm is None or self._comm.exchange is None:
            raise ValueError(f"push_pull({name!r}, asynchronous=True): asynchronous training keeps the parameters "
                             "on the servers, and this job has none (BYTEPS_FORCE_DISTRIBUTED=1 or several "
                             "worker machines)")
        if members is not None or average or (compression is not None and compression.compressor != "none"):
            raise ValueError(f"push_pull({name!r}, asynchronous=True): an asynchronous exchange sums deltas over "
                             "every worker, uncompressed (no members, average=False, no compression)")

    @contextlib.contextmanager
    def skipping_round(self) -> Iterator[None]:
        """Backup workers: the push_pulls this thread starts inside pull their round's sum without pushing.

        For a worker that learnt it is behind (:meth:`take_rounds_behind`):
        the round has closed without it, so instead of computing its
        gradients it takes the round's averages, as the others did, and
        goes on with the next round. Each push_pull must be an average over
        every worker of a round that has closed (the server refuses others).
        Not with several worker processes per machine.
        """
        if self.local_size > 1:
            raise NotImplementedError("skipping_round() with several worker processes per machine: their local "
                                      "sum is one push, which every local rank would have to skip together")
        self._skipping.on = True
        try:
            yield
        finally:
            self._skipping.on = False

    def take_rounds_behind(self) -> int:
        """Backup workers: how many rounds had closed after this worker's rounds, the least over the
        push_pulls finished since the last call (0 without backup workers, or when none told). A worker
        more than 0 behind may skip that many rounds (:meth:`skipping_round`) instead of computing them."""
        with self._lock:
            behind, self._rounds_behind = self._rounds_behind, None
        return behind or 0

    def compresses(self, nbytes: int, crosses_machines: bool = True,
                   compression: Optional[CompressionSpec] = None) -> bool:
        """Whether a push_pull of ``nbytes`` with compression_params is compressed: it must go through servers
        (between machines) and be at least BYTEPS_MIN_COMPRESS_BYTES, as in BytePS. Adapters ask it too, to
        give the tensors that go uncompressed their momentum after the pull."""
        if compression is not None and compression.compressor == "none":
            return False
        has_servers = self._comm is not None and self._comm.exchange is not None
        return has_servers and crosses_machines and nbytes >= self.config.min_compress_bytes

    def derived_id(self, name: str, variant: int, set_id: int = 0) -> int:
        """An id for a tensor that belongs to the declared tensor ``name`` (of process set ``set_id``), e.g. a
        collective's buffer of one size class (``variant`` < 64): the same on every rank, whatever the order
        in which ranks start such tensors, and never an id that declaration order gives out."""
        if set_id:
            name = f"{name} (process set {set_id})"
        with self._lock:
            base = self._tensor_ids.get(name)
        if base is None or not 0 <= variant < 64:
            raise ValueError(f"derived_id({name!r}, {variant}): declare the tensor first; variant below 64")
        number = base & ((1 << _SET_ID_SHIFT) - 1)
        if number >= 1 << (_SET_ID_SHIFT - 6):
            raise ValueError(f"derived_id({name!r}): too many tensors declared before it")
        return (_DERIVED_SETS | base >> _SET_ID_SHIFT) << _SET_ID_SHIFT | number << 6 | variant

    def push_pull(self, tensor: Any, name: str, average: bool = True, output: Any = None,
                  dtype: Optional[Union[str, DType]] = None, members: Optional[Sequence[int]] = None,
                  set_id: int = 0, root: Optional[int] = None, tensor_id: Optional[int] = None,
                  joinable: bool = True) -> Any:
        """Synchronous push_pull; returns the output array."""
        return self.push_pull_async(tensor, name, average, output, dtype, members, set_id, root, tensor_id,
                                    joinable).wait()

    def join(self, extra: Any = None) -> Tuple[int, List[Any]]:
        """Horovod's ``join()``: this rank has no more data. Until every rank has joined, the others' rounds
        count this rank's tensors as zeros (it is waited for by nobody); returns the rank that joined last.

        Ranks then agree again on what the others declared meanwhile (tensor ids, rounds, placements);
        ``extra`` (anything JSON can carry, e.g. the front's name state) is exchanged too: returned are
        the joined-last rank and every rank's ``extra``, in rank order. Supported where every rank is a
        machine of its own (servers sum) or every rank is on one machine (no servers).
        """
        if self._comm is None:
            return self.rank, [extra]
        if self.config.backup_workers:
            raise NotImplementedError(
                "join() with BYTEPS_BACKUP_WORKERS is not supported: rounds close without the slowest machines "
                "already; unset BYTEPS_BACKUP_WORKERS to use join()")
        if self._comm.local is not None and self._comm.exchange is not None:
            raise NotImplementedError(
                "join() with several worker processes per machine and servers is not supported yet: "
                "launch one process per machine (bpslaunch --workers N) or one machine without servers "
                "(bpslaunch -np N)")
        last = self._comm.join_job()
        return last, self._agree_after_join(extra)

    def _agree_after_join(self, extra: Any) -> List[Any]:
        """Exchange every rank's declarations, rounds and placements; adopt what this rank missed."""
        with self._lock:
            mine = {"ids": dict(self._tensor_ids), "rounds": dict(self._rounds),
                    "next": {str(k): v for k, v in self._next_ids.items()}, "extra": extra,
                    "placement": self._assigner.export() if self._assigner is not None else None}
        blob = json.dumps(mine, separators=(",", ":")).encode()
        sizes = np.zeros(self.size, dtype=np.int64)
        sizes[self.rank] = len(blob)
        self.push_pull(sizes, "byteps.join.sizes", average=False, tensor_id=self._reserved_id(0))
        words = [-(-int(n) // 4) for n in sizes]
        size_class = max(1, sum(words)).bit_length()
        table = np.zeros(1 << size_class, dtype=np.int32)
        start = sum(words[:self.rank])
        padded = blob + bytes(4 * words[self.rank] - len(blob))
        table[start:start + words[self.rank]] = np.frombuffer(padded, dtype=np.int32)
        self.push_pull(table, f"byteps.join.state.{size_class}", average=False,
                       tensor_id=self._reserved_id(1 + size_class))
        raw, states, offset = table.view(np.uint8), [], 0
        for rank, n in enumerate(sizes):
            states.append(json.loads(bytes(raw[4 * offset:4 * offset + int(n)])))
            offset += words[rank]
        # The rank that declared most has seen every declaration (they come in one order everywhere).
        leader = max(states, key=lambda state: len(state["ids"]))
        with self._lock:
            for state in states:
                for name, tensor_id in state["ids"].items():
                    known = self._tensor_ids.setdefault(name, tensor_id)
                    if known != tensor_id:
                        raise RuntimeError(f"join: tensor {name!r} has id {known} here and {tensor_id} on another "
                                           "rank; every rank must declare the same tensors in the same order")
                for name, round_ in state["rounds"].items():
                    self._rounds[name] = max(self._rounds.get(name, 0), round_)
                for set_id, number in state["next"].items():
                    self._next_ids[int(set_id)] = max(self._next_ids.get(int(set_id), 0), number)
            if self._assigner is not None:
                self._assigner.adopt(leader["placement"])
        return [state["extra"] for state in states]

    @staticmethod
    def _reserved_id(number: int) -> int:
        return (_DERIVED_SETS | _RESERVED_SET) << _SET_ID_SHIFT | number

    def _finished(self, name: str, closed_after: Optional[int] = None) -> None:
        with self._lock:
            self._in_flight.discard(name)
            self._last_done = time.monotonic()
            if closed_after is not None:
                known = self._rounds_behind
                self._rounds_behind = closed_after if known is None else min(known, closed_after)

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

    @property
    def bytes_sent(self) -> int:
        return self._comm.bytes_sent if self._comm else 0

    @property
    def bytes_received(self) -> int:
        return self._comm.bytes_received if self._comm else 0

    @property
    def shared_payloads(self) -> int:
        """Payloads that moved through shared memory to or from a server on this host (BYTEPS_ENABLE_IPC)."""
        return self._comm.shared_payloads if self._comm else 0

    @property
    def rdma_payloads(self) -> int:
        """Payloads that moved by RDMA WRITE to or from a server (DMLC_ENABLE_RDMA)."""
        return self._comm.rdma_payloads if self._comm else 0

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
            self._closed = True
        linger_ms = None if goodbye else 0
        if self._comm is not None:
            self._comm.stop(linger_ms)
        self._device_staging.close()
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
        with self._lock:
            rounds = max(self._rounds.values(), default=0)
            busy = self._last_done - self._first_push_pull if self._first_push_pull is not None else 0.0
        write_report(self.config.report_dir, ProcessReport(
            "worker", self.rank, time.monotonic() - self._started, rounds, max(0.0, busy),
            self.bytes_sent, self.bytes_received, shared_payloads=self.shared_payloads,
            rdma_payloads=self.rdma_payloads))


class _TrackedHandle(Handle):
    """A handle that frees its tensor name for the next round when done."""

    def __init__(self, name: str, output: Any, worker: Worker) -> None:
        super().__init__(name, output)
        self._worker = worker

    def set_done(self) -> None:
        self._worker._finished(self.name, self.rounds_closed_after)
        super().set_done()

    def set_error(self, error: BaseException) -> None:
        self._worker._finished(self.name)
        super().set_error(error)
