"""One push_pull inside the engine, and one partition of it on its route.

A :class:`PushPullTask` is what the worker hands the engine: the tensor's
views, its partition plan, the caller's :class:`~byteps.common.options.PushPullOptions`
and what the worker derived from them for this job (the divisor of an
average, the tag every rank must agree on, the compressor, the quorum of a
backup-workers round). The engine turns each partition into a
:class:`PartitionTrip` on its :class:`~byteps.common.engine.route.Route`
and completes the task's handle when the last trip arrives.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

from byteps.common.buffers import TensorView
from byteps.common.handle import Handle
from byteps.common.options import DEFAULT_OPTIONS, PushPullOptions
from byteps.common.partition import Partition, PartitionPlan

__all__ = ["PushPullTask", "PartitionTrip"]

ByteRanges = Tuple[Tuple[int, int], ...]


@dataclasses.dataclass(eq=False)
class PushPullTask:
    """One push_pull of one tensor, on its way through the machine and the servers."""

    name: str
    round: int
    source: TensorView
    output: TensorView
    plan: PartitionPlan
    handle: Handle
    options: PushPullOptions = DEFAULT_OPTIONS
    average_over: int = 0  # 0 for a sum, else the number of workers to divide by
    machines: int = 0  # how many machines a process set's members live on (0: every worker)
    tag: int = 0  # what every rank must agree on besides averaging: 1 + a broadcast's root, TAG_GATHER, or 0
    compression: Any = None  # TensorCompressor: compressed on the way to the servers (averaged before)
    quorum: int = 0  # backup workers: the machines whose pushes close a round (0: all)
    skipped: bool = False  # backup workers: a closed round pulled without a push
    device: Any = None  # a CUDA tensor's byteps.common.device_staging.StagedTensor (None: host memory)
    #: [start, end) of this rank's nonzero bytes: partitions outside are not copied for local peers and, where
    #: this process pushes alone, go to the servers as zeros
    nonzero: Optional[Tuple[int, int]] = None
    #: byte ranges whose sum the caller does not need (held already, or not read): pulled bare (FLAG_BARE)
    skip_pull: ByteRanges = ()
    #: byte ranges where the output holds the result already, or is not read: COPY_OUT leaves them as they are
    keep_output: ByteRanges = ()
    stand_in: bool = False  # a joined local root's stand-in for the ranks still running (no handle waits)
    # --- progress, the engine's own ---
    started: float = 0.0  # time.time() when the engine started it (for the timeline)
    remaining: int = 0  # partitions not yet arrived
    network_partitions: int = 0  # partitions this process exchanges with the servers
    failed: bool = False  # nothing more happens to its partitions
    closed_after: Optional[int] = None  # backup workers: rounds closed after this one, least over the partitions

    @property
    def members(self) -> Optional[Tuple[int, ...]]:
        """A process set's global ranks; None: every worker."""
        return self.options.members

    @property
    def average(self) -> bool:
        return self.options.average

    @property
    def asynchronous(self) -> bool:
        return self.options.asynchronous

    @property
    def lr(self) -> Optional[float]:
        return self.options.lr

    @property
    def notice(self) -> Optional[str]:
        """A layout notice's layout: the round carries no data (see PushPullOptions.notice)."""
        return self.options.notice

    def spans_machines(self) -> bool:
        """Whether the task's ranks live on more than one machine (else the local sum is the result)."""
        return self.options.members is None or self.machines > 1

    def close_rounds_early(self, closed_after: int) -> None:
        """Backup workers: a partition's answer said ``closed_after`` rounds had closed after this one."""
        if self.closed_after is None or closed_after < self.closed_after:
            self.closed_after = closed_after


class PartitionTrip:
    """One partition of one push_pull on its route.

    A plain class with slots: one is made per partition and round, and its
    fields are read on every message of the hot path.
    """

    __slots__ = ("task", "part", "route", "stages", "data", "position", "source", "output", "dense", "landing",
                 "pull_nbytes", "stage_started", "sent_at", "zeros", "acked", "closed_after")

    def __init__(self, task: PushPullTask, part: Partition, route: Any) -> None:
        self.task = task
        self.part = part
        self.route = route  # the Route
        self.stages = route.stages
        window = slice(part.offset, part.offset + part.nbytes)
        self.source = task.source.data[window]  # the window of the task's input this partition starts from
        self.output = task.output.data[window]  # the window of the task's output it ends in
        self.data: Any = self.source  # the partition's bytes as they stand (input, local sum, server's sum...)
        self.position = -1  # index of the current stage in ``stages``; -1 before the first
        self.dense: Any = None  # COMPRESS: the dense buffer DECOMPRESS writes the sum into
        self.landing: Any = None  # EXCHANGE: where the sum is received (None: keep the message)
        self.pull_nbytes = part.nbytes  # bytes of the server's answer (the compressed size when compressed)
        self.stage_started = 0.0  # when the current stage began (time.time(); kept only while tracing)
        self.sent_at = 0.0  # EXCHANGE: when the push went (or was acknowledged, unpipelined; while tracing)
        self.zeros = False  # LOCAL_REDUCE found no local rank with bytes here: the machine pushes zeros
        self.acked = False  # EXCHANGE: the server acknowledged the push (its credit is back)
        self.closed_after: Optional[int] = None  # backup workers: what the server's answer said (see the task's)

    @property
    def stage(self) -> Any:
        return self.stages[self.position]
