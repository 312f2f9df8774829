"""From a caller's tensor, name and options to a task the engine can run, for this job.

The options say what the caller wants; :class:`TaskMaker` adds what follows
for this job and this round: the tensor's host views (a CUDA tensor's
pinned staging), the tensor id, round and partition plan, the divisor of an
average, the tag every rank must agree on, the compressor (kept across
rounds), the quorum of a backup-workers round, and which bytes need not
travel. Whatever depends on the job is checked here, on the calling rank,
before anything is sent.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

import numpy as np

from byteps.common.buffers import input_and_output_views
from byteps.common.compression import COMPRESSIBLE_DTYPES
from byteps.common.compression.feedback import TensorCompressor
from byteps.common.config import Config
from byteps.common.device_staging import DeviceStaging, StagedTensor, device_of
from byteps.common.engine.device import DeviceCopyDone
from byteps.common.engine.task import PushPullTask
from byteps.common.handle import Handle, JobLost
from byteps.common.options import PushPullOptions
from byteps.common.tensor_description import TAG_GATHER, notice_tag
from byteps.common.tensor_registry import TensorRegistry

__all__ = ["TaskMaker", "TrackedHandle", "LastUse"]


class LastUse(NamedTuple):
    """A name's last push_pull from host memory: what a layout notice on it sends again (as zeros)."""

    shape: Tuple[int, ...]
    dtype: np.dtype
    options: PushPullOptions
    tensor: str  # the tensor behind the name (a process set's or backup workers' own)


class TrackedHandle(Handle):
    """A handle that frees its tensor name for the next round when done; a first round that failed on every
    rank (not a lost job) retires the name (:meth:`TensorRegistry.first_round_failed`)."""

    def __init__(self, name: str, output: Any, registry: TensorRegistry, tensor_id: int = 0,
                 first_round: bool = False) -> None:
        super().__init__(name, output)
        self._registry = registry
        self._tensor_id, self._first_round = tensor_id, first_round

    def set_done(self) -> None:
        self._registry.finished(self.name, self.rounds_closed_after)
        super().set_done()

    def set_error(self, error: BaseException) -> None:
        if self._first_round and not isinstance(error, JobLost):
            self._registry.first_round_failed(self.name, self._tensor_id)
        self._registry.finished(self.name)
        super().set_error(error)


class TaskMaker:
    """Makes the tasks of one worker. ``has_servers``: the job sums through servers; ``post(item)``: the
    communication thread's queue (for a CUDA tensor's finished copies), None without one."""

    def __init__(self, config: Config, registry: TensorRegistry, rank: int, size: int, has_servers: bool,
                 post: Optional[Callable[[Any], None]]) -> None:
        self.config, self.registry = config, registry
        self.rank, self.size, self.local_size = rank, size, config.local_size
        self.has_servers, self._post = has_servers, post
        self.staging = DeviceStaging()  # CUDA tensors' pinned buffers (CuPy only once one arrives)
        self._compressors: Dict[str, TensorCompressor] = {}  # compressed tensors' state, kept across rounds
        # (name, process set id) -> its last push_pull there that a notice could follow
        self._last_use: Dict[Tuple[str, int], LastUse] = {}
        registry.on_retire(self._forget_last_uses)

    def closes_early(self, options: PushPullOptions) -> bool:
        """Backup workers: whether this push_pull's rounds close once all machines but BYTEPS_BACKUP_WORKERS
        pushed: averages over every worker through the servers (sums, broadcasts, gathers and process sets
        always wait for every rank)."""
        return bool(self.config.backup_workers and options.average and options.members is None
                    and options.root is None and options.joinable and self.has_servers)

    def name_for(self, name: str, closes_early: bool) -> str:
        """The tensor behind ``name`` for a round that closes early or not. A key's rounds all close alike at
        the servers (its first INIT_KEY says how), so with backup workers a sum, broadcast or gather of a
        name whose averages close without the late machines is a tensor of its own."""
        if self.config.backup_workers and not closes_early and self.has_servers:
            return f"{name} (every machine)"
        return name

    def compresses(self, nbytes: int, crosses_machines: bool, options: PushPullOptions) -> bool:
        """Whether a push_pull of ``nbytes`` is compressed: it must go through servers (between machines) and
        be at least BYTEPS_MIN_COMPRESS_BYTES, as in BytePS."""
        return (options.compression is not None and self.has_servers and crosses_machines
                and nbytes >= self.config.min_compress_bytes)

    def make(self, tensor: Any, name: str, options: PushPullOptions,
             skipped: bool = False) -> Tuple[Optional[PushPullTask], Handle]:
        """The task of one push_pull and its handle; no task where this worker has no engine (the handle is
        then done: a single process's push_pull is a copy)."""
        what, key = f"push_pull({name!r})", name
        closes_early = self.closes_early(options)
        staged, source, target = self._views(tensor, name, what, options, closes_early)
        if options.compression is not None and source.dtype not in COMPRESSIBLE_DTYPES:
            raise ValueError(f"{what}: compression_params {options.compression.compressor!r} takes float16, "
                             f"float32 or float64 tensors, not {source.dtype.name.lower()}")
        if options.asynchronous and not self.has_servers:
            raise ValueError(f"{what} asynchronous: asynchronous training keeps the parameters on the servers, "
                             "and this job has none (BYTEPS_FORCE_DISTRIBUTED=1 or several worker machines)")
        if skipped and not (closes_early and options.compression is None):
            raise ValueError(f"{what} in skipping_round(): only an uncompressed average over every worker closes "
                             "without the slowest machines (BYTEPS_BACKUP_WORKERS), so only such a round can be "
                             "skipped")
        ranks, machines, set_id = options.members, 0, options.set_id
        name = self.name_for(name, closes_early)
        if ranks is not None:
            if self.rank not in ranks or ranks[-1] >= self.size:
                raise ValueError(f"{what}: members {list(ranks)} (set {set_id}) must be ranks of this job "
                                 f"including this one ({self.rank})")
            machines = len({r // self.local_size for r in ranks})
            name = f"{name} (process set {set_id})"

        def first_round_broadcasts(round_: int) -> None:
            if options.asynchronous and (round_ == 0) != (options.root is not None):
                raise ValueError(f"{what}: an asynchronous tensor's first push_pull broadcasts its initial "
                                 "value (root=...), and only the first")

        tensor_id = options.tensor_id
        # A retired name's derived id would name the keys that hold its failed declaration.
        if tensor_id is None and not self.registry.declared(name) and not self.registry.retired(name):
            tensor_id = self._layout_variant_id(key, closes_early, set_id if ranks is not None else 0)
        tensor_id, round_, plan = self.registry.begin(name, set_id if ranks is not None else 0, tensor_id,
                                                      source.nbytes, source.dtype.itemsize, first_round_broadcasts)
        output = target.array if staged is None else (tensor if options.output is None else options.output)
        handle = TrackedHandle(name, output, self.registry, tensor_id, round_ == 0)
        if self._post is None:  # a single worker process: push_pull is a copy
            if staged is not None:
                staged.copy_through()
            elif target.data is not source.data:
                target.data[:] = source.data
            handle.set_done()
            return None, handle
        try:
            task = self._task(name, round_, source, target, plan, handle, options, staged, machines,
                              closes_early, skipped)
        except BaseException:
            self.registry.finished(name)
            raise
        if options.notice is None:
            self._remember(key, name, tensor, options, staged is not None or closes_early)
        if staged is not None:
            post = self._post
            start = staged.start_local if staged.local else staged.start
            start(plan.partitions, lambda _, indices, error: post(DeviceCopyDone(task, indices, error)))
        return task, handle

    def _views(self, tensor: Any, name: str, what: str, options: PushPullOptions,
               closes_early: bool) -> Tuple[Optional[StagedTensor], Any, Any]:
        output = options.output
        if device_of(tensor, f"{what} input") is not None:
            on_gpu = (self.config.gpu_local_aggregation and self.local_size > 1 and self._post is not None
                      and options.members is None and options.compression is None and not closes_early)
            staged = self.staging.stage(tensor, output, name, what, options.dtype, options.stream, on_gpu)
            return staged, staged.source, staged.target
        if output is not None and device_of(output, f"{what} output") is not None:
            raise ValueError(f"{what}: the input is on the CPU but the output on a CUDA device; "
                             "pass both on the same device")
        source, target = input_and_output_views(tensor, output, what, options.dtype)
        return None, source, target

    def _task(self, name: str, round_: int, source: Any, target: Any, plan: Any, handle: Handle,
              options: PushPullOptions, staged: Optional[StagedTensor], machines: int, closes_early: bool,
              skipped: bool) -> PushPullTask:
        ranks, root = options.members, options.root
        count = self.size if ranks is None else len(ranks)
        compressor = None
        if self.compresses(source.nbytes, ranks is None or machines > 1, options):
            compressor = self._compressor(name, source, plan, options)
        tag = root + 1 if root is not None else 0 if options.joinable else TAG_GATHER
        nonzero, skip_pull = options.nonzero, options.skip_pull
        if options.notice is not None:  # no data: zeros pushed as headers, nothing pulled back
            tag, nonzero, skip_pull = notice_tag(options.notice), (0, 0), ((0, source.nbytes),)
        elif root is not None and root != self.rank:
            nonzero = (0, 0)  # a broadcast's other ranks push zeros: none of them need to travel
        elif root is not None and not options.asynchronous and target.data is source.data:
            skip_pull = ((0, source.nbytes),)  # the others push zeros: the root's tensor is the sum
        quorum = 0
        if closes_early:  # averaged over the machines that closed the round
            quorum = self.config.num_worker - self.config.backup_workers
            count = quorum * self.local_size
        # The ranges of skip_pull whose output stays as it is (COPY_OUT leaves them): uncompressed (no error
        # feedback to apply), from host memory, every machine's push awaited. Where this process pushes alone
        # they are also pulled bare (with local peers the root's slot must hold the machine's sum).
        kept = () if compressor is not None or staged is not None or quorum else skip_pull
        return PushPullTask(name=name, round=round_, source=source, output=target, plan=plan, handle=handle,
                            options=options, average_over=count if options.average else 0, machines=machines,
                            tag=tag, compression=compressor, quorum=quorum, skipped=skipped, device=staged,
                            nonzero=nonzero if compressor is None else None,
                            skip_pull=kept if self.local_size == 1 else (), keep_output=kept)

    def _compressor(self, name: str, source: Any, plan: Any, options: PushPullOptions) -> TensorCompressor:
        segments = options.segments
        if segments is not None:
            elements = source.nbytes // source.dtype.itemsize
            if sum(segments) != elements:
                raise ValueError(f"push_pull({name!r}): segments {list(segments)} must be positive element counts "
                                 f"that add up to the tensor's {elements} elements")
            if plan is not None and len(plan.partitions) > 1:
                raise ValueError(f"push_pull({name!r}): a bucket of compressed segments must fit one partition; "
                                 f"its {source.nbytes} bytes are {len(plan.partitions)} partitions of "
                                 "BYTEPS_PARTITION_BYTES")
        compressor = self._compressors.get(name)
        if compressor is None or not compressor.matches(options.compression, source.dtype, segments):
            compressor = self._compressors[name] = TensorCompressor(options.compression, source.dtype, segments)
        return compressor

    def _layout_variant_id(self, key: str, closes_early: bool, set_id: int) -> Optional[int]:
        """The id of ``"<name>#<k>"`` (the adapters' tensor for the k-th layout a name is used with,
        :mod:`byteps.common.frontend.names`), 0 < k < 64, where ``name`` is declared (in the set) and the variant
        is not (an adapter that declares as it issues, MXNet's, keeps that id): derived from the name's id, not
        the next in declaration order. A switch of layout waits for the other ranks first,
        and a refused one is never declared: ids that followed declaration order would then differ between
        ranks (a graph's other ops declare meanwhile, or a rank refused a switch the others never tried)."""
        base, mark, variant = key.rpartition("#")
        if not mark or not variant.isdigit() or not 0 < int(variant) < 64:
            return None
        try:
            return self.registry.derived_id(self.name_for(base, closes_early), int(variant), set_id)
        except ValueError:  # the name itself is not declared here
            return None

    def _remember(self, key: str, tensor_name: str, tensor: Any, options: PushPullOptions, unfit: bool) -> None:
        """Keep what a layout notice on ``key`` would send; forget it where a notice cannot follow (a CUDA
        tensor, a compressed, asynchronous or backup-workers round: those keys take no data-less round)."""
        scoped = (key, options.set_id)
        if unfit or options.compression is not None or options.asynchronous or not isinstance(tensor, np.ndarray):
            self._last_use.pop(scoped, None)
        else:
            kept = options if options.output is None else options.replace(output=None)  # not the caller's buffer
            self._last_use[scoped] = LastUse(tensor.shape, tensor.dtype, kept, tensor_name)

    def _forget_last_uses(self, tensor_name: str) -> None:
        """A retired tensor's last use cannot carry a notice: its ranks each declared something else."""
        for scoped, last in list(self._last_use.items()):
            if last.tensor == tensor_name:
                self._last_use.pop(scoped, None)

    def last_use(self, key: str, set_id: int = 0) -> Optional[LastUse]:
        """The last push_pull of ``key`` in process set ``set_id`` (0: every rank) that a layout notice can
        follow (None: none, or one that cannot)."""
        return self._last_use.get((key, set_id))

    def close(self) -> None:
        self.staging.close()
