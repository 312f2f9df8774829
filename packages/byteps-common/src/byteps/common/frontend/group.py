"""Grouped push_pulls, small tensors fused, for any framework's tensors.

byteps-common's :func:`byteps.common.fusion.push_pull_group_async` packs the
small tensors of one call into buckets of at most BYTEPS_FUSION_THRESHOLD
bytes and push_pulls each bucket once, so a model's hundreds of biases and
norms cost a few messages instead of hundreds. This module is its front
for the adapters: :func:`submit_group` turns framework tensors into that
call (names, in-flight reservation, compression, host staging, integer
handles), with the framework's part in a :class:`Staging`
(:func:`byteps.common.handle.all_done` joins a group's handles into one,
for adapters that wait on a group as a whole: an engine op, a graph op).

Every rank must make the same call: same names, shapes and dtypes, in the
same order.

Example (an adapter)::

    handles = submit_group(tracker, TorchStaging, tensors, names, average=True, compression=Compression.none)
"""

from __future__ import annotations

import time
from typing import Any, List, NamedTuple, Optional, Sequence

import numpy as np

from byteps.common import api
from byteps.common.compression import CompressionSpec
from byteps.common.dtypes import DType, dtype_of
from byteps.common.frontend.reductions import divide_towards_zero
from byteps.common.fusion import declare_group, push_pull_group_async
from byteps.common.handle import Handle

try:
    from typing import Protocol
except ImportError:  # pragma: no cover - Python < 3.8
    Protocol = object  # type: ignore[assignment,misc]

__all__ = ["Staging", "Staged", "declare_group", "push_pull_group", "submit_group"]

FAMILY = "push_pull_group"


class Staged(Protocol):
    """A tensor's bytes where byteps reads and writes them."""

    array: np.ndarray   # numpy view of the host bytes
    dtype: DType        # their byteps dtype
    layout: Any         # hashable (shape, dtype): picks the byteps tensor behind a name


class Staging(Protocol):
    """The framework's part of a grouped push_pull."""

    @staticmethod
    def check(tensor: Any, what: str) -> None:
        """TypeError/ValueError unless byteps can reduce ``tensor`` (dtype is checked in ``stage``)."""

    @staticmethod
    def detach(tensor: Any) -> Any:
        """``tensor`` without autograd history (what is compressed and sent)."""

    @staticmethod
    def stage(tensor: Any, what: str) -> Staged:
        """``tensor``'s bytes on the host (a view when it is there already)."""

    @staticmethod
    def write_back(staged: Staged, result: Any, target: Any) -> Any:
        """Put ``result`` (decompressed, on the host) into ``target`` unless they share memory; returns target."""

    @staticmethod
    def on_device(staged: Staged) -> Any:
        """The staged bytes as a tensor on the original tensor's device."""

    # Optional: ``device(tensor)``, the framework's device of a tensor; a grouped call must not mix them.


def push_pull_group(arrays: Sequence[np.ndarray], names: Sequence[str], average: bool = True,
                    outputs: Optional[Sequence[Optional[np.ndarray]]] = None,
                    dtypes: Optional[Sequence[DType]] = None, root: Optional[int] = None,
                    compression_spec: Optional[CompressionSpec] = None, lr: Optional[float] = None) -> List[Handle]:
    """The fused grouped push_pull of host arrays on this process's worker; one core handle per array.

    For adapters that stage tensors themselves (TensorFlow's py_function
    body, MXNet's engine op); ``outputs[i]`` None means in place; ``root``
    marks broadcasts from that rank; ``compression_spec`` and ``lr``:
    BytePS's compression of the arrays large enough for it.
    """
    return push_pull_group_async(api.worker(), arrays, names, average, outputs, dtypes, root,
                                 compression=compression_spec, lr=lr)


class _Member(NamedTuple):
    name: str           # the user's name (reserved while in flight)
    token: object       # releases the name
    tensor: Any
    staged: Staged      # what byteps reads and writes (after compression, on the host)
    ctx: Any            # the compressor's context
    key: str            # the byteps tensor name


def submit_group(tracker: Any, staging: Staging, tensors: Sequence[Any], names: Optional[Sequence[str]],
                 average: bool, compression: Any, truncate_integers: bool = False,
                 compression_spec: Optional[CompressionSpec] = None, lr: Optional[float] = None) -> List[int]:
    """Start in-place push_pulls of ``tensors``, small ones fused; one integer handle per tensor, in order.

    ``truncate_integers``: integer tensors of an average are summed, then
    divided rounding towards zero (Horovod's torch), not floored.
    ``compression_spec`` and ``lr``: BytePS's compression_params (parsed)
    and the learning rate, for the tensors large enough to be compressed.

    ``names`` defaults to ``"push_pull_group.noname.<n>.<i>"``. ``tracker`` is
    the adapter's :class:`~byteps.common.frontend.handle_table.OpTracker`.
    If anything is refused, nothing is left reserved.
    """
    tensors = list(tensors)
    if names is None:
        base = tracker.names.default(FAMILY)
        names = [f"{base}.{i}" for i in range(len(tensors))]
    names = [tracker.names.resolve(FAMILY, name) for name in names]
    if len(names) != len(tensors):
        raise ValueError(f"push_pull_group: {len(tensors)} tensors but {len(names)} names")
    members: List[_Member] = []
    device_of = getattr(staging, "device", None)  # optional: the framework's device of a tensor
    try:
        for name, tensor in zip(names, tensors):
            what = f"push_pull_group({name!r})"
            staging.check(tensor, what)
            if device_of is not None and members and device_of(tensor) != device_of(members[0].tensor):
                raise ValueError(f"{what}: the tensor is on {device_of(tensor)} but {members[0].name!r} on "
                                 f"{device_of(members[0].tensor)}; one grouped call takes tensors on one device")
            sent, ctx = compression.compress(staging.detach(tensor))
            staged = staging.stage(sent, what)
            token = tracker.names.reserve(name, what)
            members.append(_Member(name, token, tensor, staged, ctx, tracker.names.key(name, staged.layout)))
        start = time.time()
        exact = [truncate_integers and average and dtype_of(m.staged.dtype).is_integer for m in members]
        cores: List[Any] = [None] * len(members)
        for summed in (False, True):
            chosen = [i for i, flag in enumerate(exact) if flag == summed]
            if chosen:
                started = push_pull_group_async(api.worker(), [members[i].staged.array for i in chosen],
                                                [members[i].key for i in chosen], average and not summed,
                                                dtypes=[members[i].staged.dtype for i in chosen],
                                                compression=compression_spec, lr=lr)
                for i, core in zip(chosen, started):
                    cores[i] = core
    except BaseException:
        for member in members:
            tracker.names.release(member.name, member.token)
        raise
    handles = []
    for core, member, truncate in zip(cores, members, exact):
        def finish(member: _Member = member, truncate: bool = truncate) -> Any:
            if truncate:
                divide_towards_zero(member.staged.array, api.size())
            result = compression.decompress(staging.on_device(member.staged), member.ctx)
            return staging.write_back(member.staged, result, member.tensor)

        handles.append(tracker.track(core, member.name, member.token, start, member.staged.array.nbytes, finish))
    return handles
