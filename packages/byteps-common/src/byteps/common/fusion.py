"""Tensor fusion: many small tensors push_pulled as one buffer, grouped explicitly.

Every push_pull pays a fixed cost (a task, a PUSH and a PULL per server, a
round trip, a done-callback) whatever its size; a BERT step has hundreds of
biases and norms of a few KB each, for which that cost dominates.
:func:`push_pull_group_async` packs the small tensors of one call into
shared buffers ("buckets") of at most ``BYTEPS_FUSION_THRESHOLD`` bytes and
push_pulls each bucket as one tensor, so the cost is paid once per bucket.

Why the grouping is explicit rather than done by the communication thread
on whatever happens to be ready: every worker must send the same key with
the same contents, and which tensors are ready together differs from worker
to worker. The buckets are therefore decided by :func:`plan_fusion` from
what is identical on every worker: the call's list of tensors (names,
sizes, dtypes, order) and the two thresholds. A bucket's name encodes its
membership, so workers whose lists differ send different names under the
same key and the servers refuse it on every rank, as for any tensor.

Example::

    handles = push_pull_group_async(worker, grads, names=[f"grad{i}" for i in range(len(grads))])
    for handle in handles:
        handle.wait()            # each gradient now holds the average, in place
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from byteps.common.buffers import TensorView, input_and_output_views
from byteps.common.compression import CompressionSpec
from byteps.common.dtypes import DType, dtype_of
from byteps.common.handle import Handle, failure
from byteps.common.in_flight import NamesInFlight
from byteps.common.options import PushPullOptions

__all__ = ["FusionGroup", "declare_group", "plan_fusion", "push_pull_group_async"]

#: Prefix of every bucket's push_pull name (keeps buckets apart from plain tensors).
BUCKET_PREFIX = "fused:"


@dataclasses.dataclass(frozen=True)
class FusionGroup:
    """One push_pull of a grouped call: a bucket of several tensors, or one tensor alone.

    ``members`` are positions in the call's list, in call order;
    ``offsets`` their byte offsets in the bucket. ``name`` is the bucket's
    push_pull name, or None for a tensor that goes alone under its own name.
    """

    members: Tuple[int, ...]
    offsets: Tuple[int, ...]
    nbytes: int
    dtype: DType
    name: Optional[str]
    compressed: bool = False  # members compressed one by one inside the bucket (BytePS's compression_params)

    @property
    def fused(self) -> bool:
        return self.name is not None


def bucket_name(names: Sequence[str], sizes: Sequence[int], dtypes: Sequence[DType]) -> str:
    """``fused:<first name>+<count>:<hash>``: the same on every worker, different when membership differs.

    The hash covers every member's name, size and dtype in order, so two
    lists that agree on the first name and the count still get different
    names (and a mismatch error from the servers) if anything else differs.
    """
    digest = hashlib.blake2b(digest_size=6)
    for name, size, dtype in zip(names, sizes, dtypes):
        digest.update(f"{name}\0{size}\0{DType(dtype).name}\n".encode())
    return f"{BUCKET_PREFIX}{names[0]}+{len(names)}:{digest.hexdigest()}"


def plan_fusion(items: Sequence[Tuple[str, int, Union[str, DType]]], threshold: int,
                max_tensor_bytes: int, compressed: Optional[Sequence[bool]] = None,
                partition_bytes: int = 0) -> List[FusionGroup]:
    """Decide the buckets of a grouped call; pure, so every worker decides alike.

    ``items`` are ``(name, nbytes, dtype)`` in call order. A tensor of at
    most ``max_tensor_bytes`` (and at most ``threshold``) is small: small
    tensors are packed in call order into the open bucket of their dtype
    until the next one would take it past ``threshold`` bytes, which closes
    it. Larger tensors go alone and do not close open buckets, so a model's
    biases and norms fuse across the weight matrices between them. A bucket
    left with a single member goes alone too (packing it would only copy).
    ``threshold == 0`` disables fusion: every tensor goes alone.

    Items flagged in ``compressed`` (BytePS's compression_params; the worker
    core compresses them) are packed apart, into buckets of at most one
    partition (``partition_bytes``, BYTEPS_PARTITION_BYTES): each member is
    then compressed alone, as its own partition, exactly as if it went
    alone, and the bucket is one message of the members' compressed bytes.
    Their size limit is that partition, not ``max_tensor_bytes``: what
    crosses the network is a few percent of it.

    Groups come in the order of their first member.

    >>> [g.members for g in plan_fusion([("a", 8, "float32"), ("b", 8, "float32")], 16, 8)]
    [(0, 1)]
    """
    if threshold < 0 or max_tensor_bytes < 0:
        raise ValueError(f"fusion thresholds must be >= 0, got {threshold} and {max_tensor_bytes}")
    flags = [bool(flag) for flag in compressed] if compressed is not None else [False] * len(items)
    if len(flags) != len(items):
        raise ValueError(f"plan_fusion: {len(items)} items but {len(flags)} compressed flags")
    dtypes = [dtype_of(dtype) for _, _, dtype in items]
    buckets: List[List[int]] = []
    open_bucket: Dict[Tuple[DType, bool], Tuple[List[int], int]] = {}  # (dtype, compressed) -> (members, bytes)
    for index, (_, nbytes, _) in enumerate(items):
        dtype, squeezed = dtypes[index], flags[index]
        limit = min(threshold, partition_bytes) if squeezed else threshold
        largest = limit if squeezed else max_tensor_bytes
        if limit == 0 or nbytes > largest or nbytes > limit:
            buckets.append([index])
            continue
        members, used = open_bucket.get((dtype, squeezed), (None, 0))
        if members is None or used + nbytes > limit:
            members, used = [], 0
            buckets.append(members)
        members.append(index)
        open_bucket[(dtype, squeezed)] = (members, used + nbytes)
    buckets.sort(key=lambda members: members[0])
    groups = []
    for members in buckets:
        sizes = [int(items[i][1]) for i in members]
        offsets = tuple(int(x) for x in np.cumsum([0] + sizes[:-1]))
        name = None
        if len(members) > 1:
            name = bucket_name([items[i][0] for i in members], sizes, [dtypes[i] for i in members])
        groups.append(FusionGroup(tuple(members), offsets, sum(sizes), dtypes[members[0]], name,
                                  flags[members[0]]))
    return groups


class _BucketDone:
    """The completion all members of one bucket round share: one event, not one per member.

    A round of a few hundred small tensors would otherwise spend more time
    creating and setting per-member events and locks than sending its bucket.
    """

    def __init__(self) -> None:
        self.event = threading.Event()
        self.error: Optional[BaseException] = None
        self.lock = threading.Lock()
        self.callbacks: List[Tuple[Handle, Callable[[Handle], None]]] = []

    def finish(self, error: Optional[BaseException]) -> None:
        with self.lock:
            self.error = error
            self.event.set()
            callbacks, self.callbacks = self.callbacks, []
        for handle, callback in callbacks:
            handle._run(callback)


class _MemberHandle(Handle):
    """A fused tensor's handle: done when its bucket's sum has been copied into its output."""

    def __init__(self, name: str, output: Any, shared: _BucketDone) -> None:
        # Handle.__init__ is skipped on purpose: its event and lock are what _BucketDone shares.
        self.name = name
        self._output = output
        self._shared = shared

    def poll(self) -> bool:
        return self._shared.event.is_set()

    def wait(self, timeout: Optional[float] = None) -> Any:
        if not self._shared.event.wait(timeout):
            raise TimeoutError(f"push_pull of {self.name!r} did not finish within {timeout} s")
        if self._shared.error is not None:
            raise failure(self.name, self._shared.error) from self._shared.error
        return self._output

    @property
    def error(self) -> Optional[BaseException]:
        return self._shared.error

    def add_done_callback(self, callback: Callable[[Handle], None]) -> None:
        with self._shared.lock:
            if not self._shared.event.is_set():
                self._shared.callbacks.append((self, callback))
                return
        self._run(callback)

    def set_done(self) -> None:
        raise RuntimeError("a fused tensor's handle completes with its bucket")

    set_error = set_done  # type: ignore[assignment]


class _Bucket:
    """A bucket's staging buffer, kept and reused across rounds."""

    def __init__(self, group: FusionGroup) -> None:
        self.data = np.empty(group.nbytes, dtype=np.uint8)
        self.typed = self.data.view(group.dtype.storage)


class _FusionState:
    """Per-worker memory of plans, staging buffers and the grouped push_pulls in flight."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.plans: Dict[tuple, List[FusionGroup]] = {}
        self.buckets: Dict[str, _Bucket] = {}
        self.in_flight = NamesInFlight()  # push_pull names (buckets and lone tensors) of grouped calls

    def plan(self, key: tuple, threshold: int, max_tensor_bytes: int, compressed: Tuple[bool, ...],
             partition_bytes: int) -> List[FusionGroup]:
        with self.lock:
            found = self.plans.get((key, compressed))
        if found is None:
            found = plan_fusion(key, threshold, max_tensor_bytes, compressed, partition_bytes)
            with self.lock:
                if len(self.plans) > 1024:  # a caller whose lists never repeat: do not grow forever
                    self.plans.clear()
                self.plans[(key, compressed)] = found
        return found

    def reserve(self, names: List[str]) -> None:
        """Mark every push_pull of a call in flight, or none: a refused call submits nothing.

        Without this a call repeated too early would be refused half-way,
        after some of its push_pulls were sent (a mismatch for the other
        ranks), or would overwrite a bucket's staging buffer in flight.
        """
        self.in_flight.reserve(names, lambda busy: (
            f"push_pull_group: {'bucket' if busy.startswith(BUCKET_PREFIX) else 'tensor'} {busy!r} is still in "
            "flight; wait for the handles of the previous call with these tensors before submitting them again"))

    def release(self, name: str) -> None:
        self.in_flight.release(name)

    def staging(self, group: FusionGroup) -> _Bucket:
        with self.lock:
            bucket = self.buckets.get(group.name)
            if bucket is None or bucket.data.nbytes != group.nbytes:
                bucket = self.buckets[group.name] = _Bucket(group)
            return bucket


_states: weakref.WeakKeyDictionary[Any, _FusionState] = weakref.WeakKeyDictionary()
_states_lock = threading.Lock()


def _state_of(worker: Any) -> _FusionState:
    with _states_lock:
        state = _states.get(worker)
        if state is None:
            state = _states[worker] = _FusionState()
        return state


def _views(tensors: Sequence[Any], names: Sequence[str], outputs: Optional[Sequence[Any]],
           dtypes: Optional[Sequence[Any]]) -> List[Tuple[TensorView, TensorView]]:
    """(input, output) views of every tensor, checked before anything is submitted."""
    count = len(tensors)
    for what, given in (("names", names), ("outputs", outputs), ("dtypes", dtypes)):
        if given is not None and len(given) != count:
            raise ValueError(f"push_pull_group: {count} tensors but {len(given)} {what}")
    seen = set()
    for name in names:
        if not isinstance(name, str) or not name:
            raise ValueError(f"push_pull_group: a tensor name must be a non-empty string, got {name!r}")
        if name in seen:
            raise ValueError(f"push_pull_group: the name {name!r} appears twice in one call")
        seen.add(name)
    views = []
    for i, tensor in enumerate(tensors):
        dtype = None if dtypes is None else dtypes[i]
        output = None if outputs is None else outputs[i]
        views.append(input_and_output_views(tensor, output, f"push_pull_group({names[i]!r})", dtype))
    return views


def declare_group(worker: Any, names: Sequence[str], sizes: Sequence[int], dtypes: Sequence[Any],
                  compression: Optional[CompressionSpec] = None) -> None:
    """Give the push_pulls of a later :func:`push_pull_group_async` call their tensor ids now, in order.

    ``names``, ``sizes`` (bytes) and ``dtypes`` as that call will see its
    tensors. A bucket is otherwise declared when the call first sends it;
    an adapter that issues grouped calls on one thread and runs them on
    another (MXNet's engine) calls this where it issues them. Tensor ids
    are given in declaration order, and the servers know a tensor by its
    id, so every rank must declare in the same order: declared by the
    engine thread, a bucket raced the issuing thread's next declarations,
    and ranks that ran it at different moments gave it different ids
    (docs/decisions.md, "MXNet's fused engine op").
    """
    if not worker.is_distributed:
        return  # no servers: nothing is fused (see push_pull_group_async)
    config = worker.config
    key = tuple((name, int(size), dtype_of(dtype)) for name, size, dtype in zip(names, sizes, dtypes))
    compressed = tuple(compression is not None and worker.compresses(size, True, compression) for _, size, _ in key)
    for group in _state_of(worker).plan(key, config.fusion_threshold, config.fusion_max_tensor_bytes, compressed,
                                        config.partition_bytes):
        worker.declare(group.name or names[group.members[0]])


def push_pull_group_async(worker: Any, tensors: Sequence[Any], names: Sequence[str], average: bool = True,
                          outputs: Optional[Sequence[Any]] = None,
                          dtypes: Optional[Sequence[Any]] = None, root: Optional[int] = None,
                          compression: Optional[CompressionSpec] = None,
                          lr: Optional[float] = None) -> List[Handle]:
    """Start push_pulls of many tensors at once, small ones fused; one handle per tensor, in order.

    Every worker must make the same call: the same names, sizes and dtypes
    in the same order (servers refuse a bucket whose membership differs,
    on every rank). Results go into ``outputs`` (default: in place), as
    with :meth:`Worker.push_pull_async`; ``dtypes`` overrides element
    types (``"bfloat16"`` over 16-bit integer storage); ``root`` marks a
    group of broadcasts from that rank (see :meth:`Worker.push_pull_async`).
    Thresholds come from ``worker.config`` (``fusion_threshold``,
    ``fusion_max_tensor_bytes``).

    ``compression`` (BytePS's compression_params, parsed) and ``lr`` (the
    optimizer's learning rate): the tensors the worker core compresses
    (:meth:`Worker.compresses`) are fused apart, each compressed alone in
    its bucket (see :func:`plan_fusion`); the others as without it.

    A fused tensor is copied into its bucket's staging buffer (kept per
    bucket, reused every round) during the call; its output is written when
    the bucket's sum arrives, and its handle then completes. Tensors that
    go alone are read in place, so leave every input and output alone until
    its handle is done. A bucket's failure fails every member's handle.
    Submitting a call again while any of its push_pulls is in flight is a
    ValueError, raised before anything is sent.
    """
    views = _views(tensors, names, outputs, dtypes)
    config = worker.config
    if not worker.is_distributed:
        # One worker alone: push_pull is a copy, and packing would only add one.
        return [worker.push_pull_async(source.array, name, PushPullOptions(
                    average=average, output=None if target is source else target.array, dtype=source.dtype,
                    root=root)) for name, (source, target) in zip(names, views)]
    state = _state_of(worker)
    key = tuple((name, source.nbytes, source.dtype) for name, (source, _) in zip(names, views))
    compressed = tuple(compression is not None and worker.compresses(source.nbytes, True, compression)
                       for source, _ in views)
    groups = state.plan(key, config.fusion_threshold, config.fusion_max_tensor_bytes, compressed,
                        config.partition_bytes)
    push_pull_names = [group.name or names[group.members[0]] for group in groups]
    state.reserve(push_pull_names)
    handles: List[Optional[Handle]] = [None] * len(views)
    for position, group in enumerate(groups):
        try:
            if group.fused:
                members = [(names[i], views[i]) for i in group.members]
                submitted = _submit_bucket(worker, state, group, members, average, root,
                                           compression if group.compressed else None, lr)
                for index, handle in zip(group.members, submitted):
                    handles[index] = handle
                continue
            index = group.members[0]
            source, target = views[index]
            handle = worker.push_pull_async(source.array, names[index], PushPullOptions(
                average=average, output=None if target is source else target.array, dtype=source.dtype, root=root,
                compression=compression if compressed[index] else None, lr=lr if compressed[index] else None))
        except BaseException:
            for name in push_pull_names[position:]:
                state.release(name)
            raise
        handle.add_done_callback(lambda _done, name=names[index]: state.release(name))
        handles[index] = handle
    return handles  # type: ignore[return-value]


def _submit_bucket(worker: Any, state: _FusionState, group: FusionGroup,
                   members: List[Tuple[str, Tuple[TensorView, TensorView]]], average: bool,
                   root: Optional[int] = None, compression: Optional[CompressionSpec] = None,
                   lr: Optional[float] = None) -> List[Handle]:
    bucket = state.staging(group)
    for offset, (_, (source, _)) in zip(group.offsets, members):
        bucket.data[offset:offset + source.nbytes] = source.data
    options = PushPullOptions(average=average, dtype=group.dtype, root=root)
    if compression is not None:  # each member compressed alone: its element count is a segment
        options = options.replace(compression=compression, lr=lr, segments=tuple(
            source.nbytes // group.dtype.itemsize for _, (source, _) in members))
    core = worker.push_pull_async(bucket.typed, group.name, options)
    shared = _BucketDone()
    handles: List[Handle] = [_MemberHandle(name, target.array, shared) for name, (_, target) in members]

    def unpack(done: Handle) -> None:
        error = done.error
        if error is None:
            try:
                for offset, (_, (_, target)) in zip(group.offsets, members):
                    np.copyto(target.data, bucket.data[offset:offset + target.nbytes])
            except Exception as exc:  # e.g. an output freed under us: fail the members, not the comm thread
                error = exc
        state.release(group.name)
        shared.finish(error)

    core.add_done_callback(unpack)
    return handles
