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
thread) and the group returns when all of it is done. Runs eagerly; inside
a ``tf.function`` :mod:`byteps.tensorflow.graph_ops` calls it through
``tf.py_function``.

Tensor names: byteps fixes a name's size and dtype at first use; a name
used again with another shape or dtype becomes ``"<name>#<k>"`` (numbered in
order of first use, the same on every rank that issues the same ops), as in
byteps-torch.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from byteps.common import Handle, api
from byteps.common.dtypes import DType
from byteps.tensorflow.tensors import HostView, ResultBuffer, byteps_dtype, host_view

__all__ = ["Reduce", "Gather", "Spec", "execute", "key_name", "forget_names"]


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

_lock = threading.Lock()
_layouts: Dict[str, List[Tuple[Tuple[int, ...], DType]]] = {}


def key_name(name: str, shape: Sequence[int], dtype: DType) -> str:
    """The byteps tensor name behind a user's name: one per (shape, dtype) it is used with."""
    layout = (tuple(int(d) for d in shape), dtype)
    with _lock:
        seen = _layouts.setdefault(name, [])
        if layout not in seen:
            seen.append(layout)
        index = seen.index(layout)
    return name if index == 0 else f"{name}#{index}"


def forget_names() -> None:
    """Forget name layouts (at shutdown: a new job starts with fresh tensor ids)."""
    with _lock:
        _layouts.clear()


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


def _submit_reduce(spec: Reduce, tensor: tf.Tensor) -> _Pending:
    view = host_view(tensor, f"push_pull({spec.name!r})")
    if spec.contribute:
        result = ResultBuffer.like(view)
        return _push_pull(view.array, result, spec.name, view.shape, spec.average, view.device)
    zeros = ResultBuffer.like(view, zero=True)  # reduced in place: no second buffer
    return _push_pull(zeros.array, zeros, spec.name, view.shape, spec.average, view.device)


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
    try:
        for spec, tensors in _split(specs, inputs):
            started.append(_submit_reduce(spec, tensors[0]) if isinstance(spec, Reduce)
                           else _GatherInFlight(spec, tensors))
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
