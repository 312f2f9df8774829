"""Eager execution of a group of byteps reductions on TensorFlow tensors.

A group is a list of specs, each with its input tensors:

* :class:`Reduce` sums (or averages) one tensor over all workers, or, with
  ``contribute=False``, pushes zeros so the sum is the other ranks' tensor
  (BytePS's broadcast);
* :class:`Gather` concatenates every rank's rows of one or more tensors with
  the same leading dimension (an allgather, e.g. an IndexedSlices' values and
  indices). byteps servers only sum, so a gather is two push_pulls: the
  ranks' row counts (each rank fills its own slot of a zero vector), then a
  zero buffer in which each rank fills its own rows. Adding zeros is exact,
  so the result is the concatenation, bit for bit. Buffers are rounded up
  to a power of two rows, so a varying row count reuses a few tensor names.

Everything of a group is in flight at once (pipelined by byteps' comm
thread) and the group returns when all of it is done. Consecutive Reduce
specs go as one grouped push_pull (:func:`byteps.common.frontend.group.push_pull_group`),
which fuses the small tensors into buckets of at most
BYTEPS_FUSION_THRESHOLD bytes: a model's biases and norms, reduced by
DistributedGradientTape or DistributedOptimizer, cost a few messages. Runs eagerly; inside
a ``tf.function`` :mod:`byteps.tensorflow.graph_ops` calls it through
``tf.py_function``.

Tensor names: byteps fixes a name's size and dtype at first use; a name
used again with another shape or dtype becomes ``"<name>#<k>"`` (numbered in
order of first use, the same on every rank that issues the same ops), as in
byteps-torch.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from byteps.common import Handle, api
from byteps.common.dtypes import DType
from byteps.common.frontend import TensorNames, after_shutdown
from byteps.common.frontend.group import push_pull_group
from byteps.tensorflow.tensors import HostView, ResultBuffer, byteps_dtype, host_view

__all__ = ["Reduce", "Gather", "Spec", "execute", "key_name", "forget_names", "tensor_names"]


@dataclasses.dataclass(frozen=True)
class Reduce:
    """Sum or average one tensor over all workers; ``contribute=False`` pushes zeros."""

    name: str
    average: bool
    contribute: bool = True

    inputs = 1

    def outputs(self) -> int:
        return 1


@dataclasses.dataclass(frozen=True)
class Gather:
    """Concatenate ``parts`` tensors of equal leading dimension over all ranks, in rank order.

    Outputs: the ``parts`` gathered tensors, then the int64 vector of every
    rank's row count.
    """

    name: str
    parts: int = 1

    @property
    def inputs(self) -> int:
        return self.parts

    def outputs(self) -> int:
        return self.parts + 1


Spec = Union[Reduce, Gather]

#: Default names, per-layout names (see the module doc) of this adapter.
tensor_names = TensorNames()


def key_name(name: str, shape: Sequence[int], dtype: DType) -> str:
    """The byteps tensor name behind a user's name: one per (shape, dtype) it is used with."""
    return tensor_names.key(name, (tuple(int(d) for d in shape), dtype))


#: Forget name layouts (at shutdown: a new job starts with fresh tensor ids).
forget_names = tensor_names.forget
after_shutdown(forget_names)


class _Pending:
    """One push_pull in flight and the buffer its result lands in."""

    def __init__(self, core: Optional[Handle], result: ResultBuffer, shape: Tuple[int, ...], device: str) -> None:
        self.core, self.result, self.shape, self.device = core, result, shape, device

    def wait(self) -> None:
        if self.core is not None:
            self.core.wait()

    def tensor(self) -> tf.Tensor:
        self.wait()
        return self.result.to_tensor(self.shape, self.device)


def _push_pull(source: np.ndarray, result: ResultBuffer, name: str, shape: Tuple[int, ...], average: bool,
               device: str = "") -> _Pending:
    """Start one push_pull of ``source`` into ``result`` (the same memory for an in-place one)."""
    key = key_name(name, shape, result.dtype)
    if result.array.nbytes == 0:  # nothing to send; every rank has the same empty result
        return _Pending(None, result, shape, device)
    # Shaped views: servers compare shapes too, not only sizes, across ranks.
    output = None if source is result.array else result.array.reshape(shape)
    core = api.worker().push_pull_async(source.reshape(shape), key, average, output, result.dtype)
    return _Pending(core, result, shape, device)


def _submit_reduces(run: Sequence[Tuple[Reduce, tf.Tensor]]) -> List[_Pending]:
    """Start consecutive Reduce specs of one averaging flag as one grouped push_pull, small tensors fused.

    A spec that does not contribute (a broadcast's other ranks) is reduced
    in place in a zeroed buffer: no second buffer.
    """
    pendings, sent, sources, keys, outputs, dtypes = [], [], [], [], [], []
    for spec, tensor in run:
        view = host_view(tensor, f"push_pull({spec.name!r})")
        result = ResultBuffer.like(view, zero=not spec.contribute)
        source = view.array if spec.contribute else result.array
        key = key_name(spec.name, view.shape, result.dtype)
        pending = _Pending(None, result, view.shape, view.device)
        pendings.append(pending)
        if result.array.nbytes == 0:  # nothing to send; every rank has the same empty result
            continue
        # Shaped views: servers compare shapes too, not only sizes, across ranks.
        sources.append(source.reshape(view.shape))
        outputs.append(None if source is result.array else result.array.reshape(view.shape))
        keys.append(key)
        dtypes.append(result.dtype)
        sent.append(pending)
    if sources:
        for pending, core in zip(sent, push_pull_group(sources, keys, run[0][0].average, outputs, dtypes)):
            pending.core = core
    return pendings


class _GatherInFlight:
    """A gather between its two rounds: counts first, then the rows."""

    def __init__(self, spec: Gather, tensors: Sequence[tf.Tensor]) -> None:
        self.spec = spec
        what = f"gather({spec.name!r})"
        self.views: List[HostView] = [host_view(t, what) for t in tensors]
        rows = {view.shape[0] if view.shape else None for view in self.views}
        if None in rows or len(rows) != 1:
            raise ValueError(f"{what}: every part needs the same leading dimension, got shapes "
                             f"{[view.shape for view in self.views]}")
        self.rows = rows.pop()
        counts = ResultBuffer.empty(DType.INT64, api.size(), zero=True)
        counts.array[api.rank()] = self.rows
        self.counts = _push_pull(counts.array, counts, f"{spec.name}.counts", (api.size(),), average=False)
        self.parts: List[_Pending] = []
        self.total = 0

    def submit_rows(self) -> None:
        self.counts.wait()
        counts = self.counts.result.array
        self.total = int(counts.sum())
        offset = int(counts[:api.rank()].sum())
        capacity = 1
        while capacity < self.total:
            capacity *= 2
        for j, view in enumerate(self.views):
            trailing = view.shape[1:]
            row = int(np.prod(trailing, dtype=np.int64))
            buffer = ResultBuffer.empty(view.dtype, capacity * row, zero=True)
            buffer.buffer.write_at(offset * row * view.dtype.itemsize, view.array)
            self.parts.append(_push_pull(buffer.array, buffer, f"{self.spec.name}.{j}", (capacity, *trailing),
                                         average=False, device=view.device))

    def tensors(self) -> List[tf.Tensor]:
        outputs = []
        for pending, view in zip(self.parts, self.views):
            pending.wait()
            outputs.append(pending.result.to_tensor((self.total, *view.shape[1:]), view.device))
        self.counts.wait()
        outputs.append(self.counts.result.to_tensor((api.size(),)))
        return outputs


def execute(specs: Sequence[Spec], inputs: Sequence[tf.Tensor]) -> List[tf.Tensor]:
    """Run a group eagerly; returns the outputs of every spec, flattened in order.

    Dtypes are checked before anything is sent. If submitting fails half way,
    what is already in flight is waited for before the error is raised, so
    no name stays busy.
    """
    for spec, tensors in _split(specs, inputs):
        for tensor in tensors:
            byteps_dtype(tensor.dtype, f"push_pull({spec.name!r})")
    started: List[Union[_Pending, _GatherInFlight]] = []
    run: List[Tuple[Reduce, tf.Tensor]] = []  # consecutive Reduce specs of one averaging flag
    try:
        for spec, tensors in _split(specs, inputs):
            if isinstance(spec, Reduce) and (not run or run[0][0].average == spec.average):
                run.append((spec, tensors[0]))
                continue
            started.extend(_submit_reduces(run))
            run = []
            if isinstance(spec, Reduce):
                run.append((spec, tensors[0]))
            else:
                started.append(_GatherInFlight(spec, tensors))
        started.extend(_submit_reduces(run))
        for item in started:
            if isinstance(item, _GatherInFlight):
                item.submit_rows()
    except BaseException:
        _drain(started)
        raise
    outputs: List[tf.Tensor] = []
    failure: Optional[BaseException] = None
    for item in started:
        try:
            outputs.extend([item.tensor()] if isinstance(item, _Pending) else item.tensors())
        except BaseException as exc:  # keep waiting for the rest, then raise the first error
            failure = failure or exc
    if failure is not None:
        raise failure
    return outputs


def _split(specs: Sequence[Spec], inputs: Sequence[tf.Tensor]):
    position = 0
    for spec in specs:
        yield spec, list(inputs[position:position + spec.inputs])
        position += spec.inputs
    if position != len(inputs):
        raise ValueError(f"a group of {len(specs)} specs takes {position} inputs, got {len(inputs)}")


def _drain(started: Sequence[Union[_Pending, _GatherInFlight]]) -> None:
    for item in started:
        pendings = [item] if isinstance(item, _Pending) else [item.counts, *item.parts]
        for pending in pendings:
            try:
                pending.wait()
            except BaseException:  # the original error matters more
                pass
