"""What a caller decides about one push_pull, as one frozen value.

Every push_pull takes a tensor, its name, and a :class:`PushPullOptions`:
whether to average, where the result goes, which ranks take part, whether it
is a broadcast, how it is compressed, and what the caller already holds.
The front and the framework adapters build one; it checks its own values
when built, so a bad value is named on the calling rank before anything is
sent. What depends on the job (a member that is not a rank of it, whether
the job has servers) is checked by the worker when the push_pull starts.

Example::

    from byteps.common import PushPullOptions
    worker.push_pull_async(grad, "fc.weight", PushPullOptions(average=True))
    worker.push_pull_async(x, "x", PushPullOptions(root=0, average=False))   # a broadcast from rank 0
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from byteps.common.compression import CompressionSpec
from byteps.common.dtypes import DType

__all__ = ["PushPullOptions", "MAX_PROCESS_SET_ID", "DEFAULT_OPTIONS"]

#: Process set ids are 1 .. this; the worker keeps the next id for its own bookkeeping tensors.
MAX_PROCESS_SET_ID = (1 << 15) - 2

ByteRange = Tuple[int, int]


@dataclasses.dataclass(frozen=True, eq=False)
class PushPullOptions:
    """Everything a caller decides about one push_pull (see :meth:`byteps.common.Worker.push_pull_async`).

    ``average``: divide the sum by the number of ranks (integers with floor
    division, like numpy's ``//``). ``output``: where the result goes
    (default: the tensor itself, in place). ``dtype``: overrides the element
    type (``"bfloat16"`` over 16-bit integer storage).

    ``members`` (global ranks, the caller among them) and ``set_id`` (a
    process set's id, 1 .. :data:`MAX_PROCESS_SET_ID`): sum over those ranks
    only; every member passes the same set.

    ``root``: a broadcast from that rank (the others push zeros); ranks that
    name different roots fail, on every rank. ``joinable=False``: a sum that
    gathers (each rank's bytes at its own offset), which fails while a rank
    has joined instead of counting it as zeros, as Horovod's allgather does.

    ``tensor_id`` (from :meth:`Worker.derived_id`): a new name's id instead
    of the next one in declaration order, for push_pulls started from any
    thread (a done-callback).

    ``compression`` (BytePS's compression_params, parsed) with ``lr``, the
    learning rate error feedback rescales by; ``segments`` (element counts)
    makes the tensor a fused bucket whose members are compressed each alone.

    ``asynchronous``: BYTEPS_ENABLE_ASYNC's parameter exchange (docs/async.md):
    the first push_pull broadcasts the initial value into the servers' store
    (``root`` given), each later one pushes a delta and returns the store.

    ``stream``: the caller's CUDA stream, which waits for a CUDA result's
    copies back (None: the handle waits for them on the host).

    ``nonzero`` (byte offsets ``(start, end)``): the tensor is zeros outside,
    so those bytes need not travel. ``skip_pull`` (byte ranges): the caller
    does not need the sum there (it holds it, or does not read it).

    ``notice`` (a layout's text, e.g. ``"((3,), 'float32')"``): the round
    carries no data; it tells the other ranks that this rank now uses the
    name behind this tensor with that layout (see
    :meth:`Worker.announce_layout`). Every rank must push the same notice
    in the round, or it fails on every rank.
    """

    average: bool = True
    output: Any = None
    dtype: Optional[Union[str, DType]] = None
    members: Optional[Tuple[int, ...]] = None
    set_id: int = 0
    root: Optional[int] = None
    joinable: bool = True
    tensor_id: Optional[int] = None
    compression: Optional[CompressionSpec] = None
    lr: Optional[float] = None
    segments: Optional[Tuple[int, ...]] = None
    asynchronous: bool = False
    stream: Optional[int] = None
    nonzero: Optional[ByteRange] = None
    skip_pull: Tuple[ByteRange, ...] = ()
    notice: Optional[str] = None

    def __post_init__(self) -> None:
        set_ = lambda field, value: object.__setattr__(self, field, value)  # noqa: E731 -- frozen
        set_("average", _flag(self.average, "average"))
        set_("joinable", _flag(self.joinable, "joinable"))
        set_("asynchronous", _flag(self.asynchronous, "asynchronous"))
        if self.compression is not None:
            if not isinstance(self.compression, CompressionSpec):
                raise ValueError(f"compression must be a CompressionSpec (parse_compression_params), "
                                 f"got {type(self.compression).__name__}")
            if self.compression.compressor == "none":
                set_("compression", None)  # one spelling of "uncompressed"
        if self.members is not None:
            ranks = tuple(sorted({_index(r, "members") for r in self.members}))
            if not 0 < self.set_id <= MAX_PROCESS_SET_ID or not ranks or ranks[0] < 0:
                raise ValueError(f"members {list(ranks)} need a process set id in 1..{MAX_PROCESS_SET_ID} "
                                 f"(got {self.set_id}) and non-negative ranks")
            set_("members", ranks)
        elif self.set_id:
            raise ValueError(f"set_id {self.set_id} without members: name the process set's ranks")
        if self.root is not None:
            set_("root", _index(self.root, "root"))
            if self.root < 0:
                raise ValueError(f"root must be a rank (>= 0), got {self.root}")
        if self.tensor_id is not None:
            set_("tensor_id", _index(self.tensor_id, "tensor_id"))
        if self.segments is not None:
            counts = tuple(_index(count, "segments") for count in self.segments)
            if not counts or min(counts) < 1:
                raise ValueError(f"segments {list(counts)} must be positive element counts")
            set_("segments", counts)
        if self.nonzero is not None:
            set_("nonzero", _byte_range(self.nonzero, "nonzero"))
        set_("skip_pull", tuple(_byte_range(span, "skip_pull") for span in self.skip_pull))
        if self.lr is not None:
            set_("lr", float(self.lr))
        if self.notice is not None and (not isinstance(self.notice, str) or not self.notice
                                        or self.asynchronous or self.compression is not None):
            raise ValueError(f"notice must be a non-empty layout text, on an uncompressed synchronous tensor "
                             f"(got {self.notice!r})")
        if self.asynchronous and (self.members is not None or self.average or self.compression is not None):
            raise ValueError("an asynchronous exchange sums deltas over every worker, uncompressed: "
                             "no members, average=False, no compression")

    def replace(self, **changes: Any) -> PushPullOptions:
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)

    @property
    def compressed(self) -> bool:
        return self.compression is not None



def _flag(value: Any, name: str) -> bool:
    if isinstance(value, (bool, np.bool_)) or isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError(f"{name} must be True or False, got {value!r}")


def _index(value: Any, name: str) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name}: {value!r} is not an integer") from None


def _byte_range(span: Sequence[int], name: str) -> ByteRange:
    try:
        start, end = (_index(value, name) for value in span)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: {span!r} must be a (start, end) pair of byte offsets") from None
    if not 0 <= start <= end:
        raise ValueError(f"{name}: ({start}, {end}) must satisfy 0 <= start <= end")
    return start, end


#: A plain average over every worker, in place.
DEFAULT_OPTIONS = PushPullOptions()
