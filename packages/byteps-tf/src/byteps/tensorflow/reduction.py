"""Eager execution of a group of byteps reductions on TensorFlow tensors.

A group is a list of specs, each with its input tensors:

* :class:`Reduce` sums (or averages) one tensor over all workers (or the ranks
  of a process set), or, with
  ``contribute=False``, pushes zeros so the sum is the other ranks' tensor
  (BytePS's broadcast);
* :class:`Gather` concatenates every rank's rows of one or more tensors with
  the same leading dimension (an allgather, e.g. an IndexedSlices' values and
  indices), through the front's allgather
  (:func:`byteps.common.frontend.collectives.allgather`: the ranks' layouts
  first, then a zero buffer in which each rank writes its own bytes; adding
  zeros is exact, so the result is the concatenation, bit for bit, for any
  dtype);
* :class:`AdasumReduce` combines one floating-point tensor over the ranks
  by Horovod's Adasum, from every rank's tensor
  (:func:`byteps.common.frontend.collectives.reduce_by_gather`): what the
  gradient wrappers do with ``op=Adasum``;
* :class:`RowSparse` sums (or averages) a ``tf.IndexedSlices``' rows by id
  over the workers through a row-sparse push_pull
  (:meth:`byteps.common.worker.Worker.sparse_push_pull_async`,
  :mod:`byteps.tensorflow.row_sparse`): the union of the ids, ascending,
  with their rows.

Everything of a group is in flight at once (pipelined by byteps' comm
thread) and the group returns when all of it is done. Consecutive Reduce
specs go as one grouped push_pull (:func:`byteps.common.frontend.group.push_pull_group`),
which fuses the small tensors into buckets of at most
BYTEPS_FUSION_THRESHOLD bytes: a model's biases and norms, reduced by
DistributedGradientTape or DistributedOptimizer, cost a few messages. Reduces
with a ``compression`` (BytePS's compression_params, parsed) that the
worker core compresses are fused apart, each compressed alone inside its
bucket (as if it went alone), with the group's learning rate; those too
small to compress fuse with the others. Runs eagerly; inside
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

from byteps.common import Handle, JobLost, PushPullError, api
from byteps.common.compression import CompressionSpec
from byteps.common.dtypes import DType
from byteps.common.frontend import TensorNames, after_shutdown
from byteps.common.frontend.collectives import RankView, allgather, reduce_by_gather
from byteps.common.frontend.group import push_pull_group
from byteps.common.frontend.reductions import Adasum
from byteps.tensorflow.row_sparse import table_name
from byteps.tensorflow.tensors import ResultBuffer, _on_cpu, byteps_dtype, from_piece, host_view, to_piece

__all__ = ["Reduce", "Gather", "AdasumReduce", "RowSparse", "Spec", "MismatchError", "JobLostError",
           "JOB_LOST_MARK", "as_tensorflow_error", "execute", "key_name", "forget_names", "tensor_names"]


class MismatchError(PushPullError, tf.errors.FailedPreconditionError):
    """A failed op (ranks that disagree, or a broken job): byteps' PushPullError and, as Horovod raises it,
    TensorFlow's FailedPreconditionError at once. Inside a ``tf.function`` TensorFlow's py_function turns it
    into an UnknownError whose message starts with ``MismatchError``."""

    def __init__(self, message: str) -> None:
        tf.errors.FailedPreconditionError.__init__(self, None, None, message)


#: How a JobLostError's message starts, inside graphs too.
JOB_LOST_MARK = "byteps lost a process of the job: "


class JobLostError(JobLost, tf.errors.AbortedError):
    """The job lost a process under this op: byteps' JobLost (what elastic training recovers from) and
    TensorFlow's AbortedError, whose message starts with :data:`JOB_LOST_MARK` so that it is recognized
    when it comes out of a graph."""

    def __init__(self, message: str) -> None:
        text = message if message.startswith(JOB_LOST_MARK) else f"{JOB_LOST_MARK}{message}"
        JobLost.__init__(self, text)
        tf.errors.AbortedError.__init__(self, None, None, text)


def as_tensorflow_error(failure: PushPullError) -> PushPullError:
    """A failed op's error as TensorFlow classes it: JobLostError for a lost process, else MismatchError."""
    if isinstance(failure, (MismatchError, JobLostError)):
        return failure
    kind = JobLostError if isinstance(failure, JobLost) else MismatchError
    converted = kind(str(failure))
    converted.__cause__ = failure
    return converted


class InvalidArgument(ValueError, tf.errors.InvalidArgumentError):
    """Bad arguments found when an op runs (e.g. alltoall splits that do not add up): a ValueError and, as
    Horovod raises it, TensorFlow's InvalidArgumentError (in a graph, py_function makes a ValueError one)."""

    def __init__(self, message: str) -> None:
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)


@dataclasses.dataclass(frozen=True)
class Reduce:
    """Sum or average one tensor over all workers (or a process set's ``view``); ``contribute=False`` pushes
    zeros (a broadcast from ``root``)."""

    name: str
    average: bool
    contribute: bool = True
    root: Optional[int] = None  # a broadcast's root: ranks that name different roots fail
    compression: Optional[CompressionSpec] = None  # BytePS's compression: compressed by the core (if large enough)
    view: Optional[RankView] = None  # a process set's ranks (not fused: fusion spans every rank); None: every rank

    inputs = 1

    def outputs(self) -> int:
        return 1


@dataclasses.dataclass(frozen=True)
class Gather:
    """Concatenate ``parts`` tensors of equal leading dimension over the ranks (of ``view``), in rank order.

    Outputs: the ``parts`` gathered tensors, then the int64 vector of every
    rank's row count.
    """

    name: str
    parts: int = 1
    view: Optional[RankView] = None  # a process set's ranks; None: every rank

    @property
    def inputs(self) -> int:
        return self.parts

    def outputs(self) -> int:
        return self.parts + 1


@dataclasses.dataclass(frozen=True)
class AdasumReduce:
    """Horovod's Adasum of one floating-point tensor over the ranks (of ``view``), computed by every rank from
    all ranks' tensors (:mod:`byteps.common.frontend.adasum`); float16 and bfloat16 are combined in float32, as
    ``allreduce(op=Adasum)`` does. Output: the combined tensor, of the input's shape and dtype."""

    name: str
    view: Optional[RankView] = None  # a process set's ranks; None: every rank

    inputs = 1

    def outputs(self) -> int:
        return 1


@dataclasses.dataclass(frozen=True)
class RowSparse:
    """A ``tf.IndexedSlices``' rows summed (or averaged) by id over every worker, by a row-sparse push_pull.

    Inputs: values ``(n, *row_shape)``, indices ``(n,)`` and the int64 dense
    shape; the table is ``name`` with that layout
    (:func:`byteps.tensorflow.row_sparse.table_name`) and has ``dense_shape[0]``
    rows. Outputs: the rows of the union of every worker's ids, then those ids
    (unique, ascending, in the indices' dtype).
    """

    name: str
    average: bool

    inputs = 3

    def outputs(self) -> int:
        return 2


Spec = Union[Reduce, Gather, AdasumReduce, RowSparse]

#: Default names, per-layout names (see the module doc) of this adapter.
tensor_names = TensorNames()


def key_name(name: str, shape: Sequence[int], dtype: DType, set_id: int = 0) -> str:
    """The byteps tensor name behind a user's name: one per (shape, dtype) it is used with (in process set
    ``set_id``: a switch of layout is announced to that set's ranks)."""
    return tensor_names.key(name, (tuple(int(d) for d in shape), dtype), set_id)


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


def _submit_reduces(run: Sequence[Tuple[Reduce, tf.Tensor]], lr: Optional[float] = None) -> List[_Pending]:
    """Start consecutive Reduce specs of one averaging flag, root and compression as one grouped push_pull, small
    tensors fused (compressed ones apart, each compressed alone in its bucket; ``lr`` goes with them).

    A spec that does not contribute (a broadcast's other ranks) is reduced
    in place in a zeroed buffer: no second buffer.
    """
    pendings, sent, sources, keys, outputs, dtypes = [], [], [], [], [], []
    for spec, tensor in run:
        view = host_view(tensor, f"push_pull({spec.name!r})")
        result = ResultBuffer.like(view, zero=not spec.contribute)
        source = view.array if spec.contribute else result.array
        key = key_name(spec.name, view.shape, result.dtype, spec.view.set_id if spec.view is not None else 0)
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
    first = run[0][0] if run else None
    if first is not None and first.view is not None:
        # A process set's tensors go one by one (as byteps-torch's), all in flight at once.
        for pending, source, output, key, dtype in zip(sent, sources, outputs, keys, dtypes):
            pending.core = first.view.push_pull_async(key, source, first.average, output, dtype, first.root)
        return pendings
    if sources:
        started = push_pull_group(sources, keys, first.average, outputs, dtypes, first.root,
                                  compression_spec=first.compression, lr=lr if first.compression else None)
        for pending, core in zip(sent, started):
            pending.core = core
    return pendings


class _GatherInFlight:
    """A gather through the front's allgather (:mod:`byteps.common.frontend.collectives`), one per part."""

    def __init__(self, spec: Gather, tensors: Sequence[tf.Tensor]) -> None:
        self.spec = spec
        what = f"gather({spec.name!r})"
        rows = {int(t.shape[0]) if t.shape.rank else None for t in tensors}
        if None in rows or len(rows) != 1:
            raise ValueError(f"{what}: every part needs the same leading dimension, got shapes "
                             f"{[tuple(t.shape) for t in tensors]}")
        self.kinds = [(t.dtype, "" if _on_cpu(t) else t.device) for t in tensors]
        self.started = [allgather(f"{spec.name}.{j}", to_piece(t), spec.view) for j, t in enumerate(tensors)]

    def waiting(self) -> List[Handle]:
        return [started.core for started in self.started]

    def tensors(self) -> List[tf.Tensor]:
        outputs, counts = [], ()
        for started, (dtype, device) in zip(self.started, self.kinds):
            started.core.wait()
            piece = started.finish()
            outputs.append(from_piece(piece, dtype, device))
            counts = piece.counts
        outputs.append(tf.constant(counts, dtype=tf.int64))
        return outputs


class _AdasumInFlight:
    """An Adasum through the front's gather of every rank's tensor (one gather, combined here)."""

    def __init__(self, spec: AdasumReduce, tensor: tf.Tensor) -> None:
        compute = tensor.numpy()
        if tensor.dtype in (tf.float16, tf.bfloat16):
            compute = compute.astype(np.float32)
        self.dtype, self.device = tensor.dtype, "" if _on_cpu(tensor) else tensor.device
        self.started = reduce_by_gather(spec.name, to_piece(tf.convert_to_tensor(compute)), Adasum, compute.dtype,
                                        spec.view)

    def waiting(self) -> List[Handle]:
        return [self.started.core]

    def tensors(self) -> List[tf.Tensor]:
        self.started.core.wait()
        with tf.device(self.device or "/CPU:0"):
            return [tf.cast(tf.convert_to_tensor(self.started.finish()), self.dtype)]


class _RowSparseInFlight:
    """A row-sparse push_pull of one ``tf.IndexedSlices``' values and indices."""

    def __init__(self, spec: RowSparse, values: tf.Tensor, indices: tf.Tensor, dense_shape: tf.Tensor) -> None:
        shape = [int(size) for size in dense_shape.numpy()]
        self.dtypes = (values.dtype, indices.dtype)
        self.device = "" if _on_cpu(values) else values.device
        self.core = api.worker().sparse_push_pull_async(indices.numpy(), values.numpy(),
                                                        table_name(spec.name, shape, values.dtype), shape[0],
                                                        tuple(shape[1:]), spec.average)

    def waiting(self) -> List[Handle]:
        return [self.core]

    def tensors(self) -> List[tf.Tensor]:
        ids, rows = self.core.wait()
        # The merged answer may be a read-only view of a received message: astype gives TensorFlow a copy.
        if self.dtypes[0] == tf.bfloat16:  # the rows come back in their 16-bit storage
            rows = rows.view(tf.bfloat16.as_numpy_dtype)
        with tf.device(self.device or "/CPU:0"):
            return [tf.constant(rows.astype(self.dtypes[0].as_numpy_dtype)),
                    tf.constant(ids.astype(self.dtypes[1].as_numpy_dtype))]


def execute(specs: Sequence[Spec], inputs: Sequence[tf.Tensor], lr: Optional[float] = None) -> List[tf.Tensor]:
    """Run a group eagerly; returns the outputs of every spec, flattened in order.

    ``lr`` (the optimizer's learning rate, or None) goes with every
    compressed Reduce: error feedback rescales by its change. Dtypes are
    checked before anything is sent. If submitting fails half way, what is
    already in flight is waited for before the error is raised, so no name
    stays busy.
    """
    for spec, tensors in _split(specs, inputs):
        for tensor in tensors if isinstance(spec, Reduce) else ():  # a gather moves any dtype
            byteps_dtype(tensor.dtype, f"push_pull({spec.name!r})")
    started: List[Union[_Pending, _GatherInFlight, _AdasumInFlight, _RowSparseInFlight]] = []
    run: List[Tuple[Reduce, tf.Tensor]] = []  # consecutive Reduce specs of one averaging flag, root, compression

    def kind(spec: Reduce) -> tuple:
        return spec.average, spec.root, spec.compression, spec.view

    try:
        for spec, tensors in _split(specs, inputs):
            if isinstance(spec, Reduce) and (not run or kind(run[0][0]) == kind(spec)):
                run.append((spec, tensors[0]))
                continue
            started.extend(_submit_reduces(run, lr))
            run = []
            if isinstance(spec, Reduce):
                run.append((spec, tensors[0]))
            elif isinstance(spec, Gather):
                started.append(_GatherInFlight(spec, tensors))
            elif isinstance(spec, RowSparse):
                started.append(_RowSparseInFlight(spec, *tensors))
            else:
                started.append(_AdasumInFlight(spec, tensors[0]))
        started.extend(_submit_reduces(run, lr))
    except BaseException as exc:
        _drain(started)
        if isinstance(exc, PushPullError):  # a switch of layout the other ranks did not make (key_name)
            raise as_tensorflow_error(exc) from exc
        raise
    outputs: List[tf.Tensor] = []
    failure: Optional[BaseException] = None
    for item in started:
        try:
            outputs.extend([item.tensor()] if isinstance(item, _Pending) else item.tensors())
        except BaseException as exc:  # keep waiting for the rest, then raise the first error
            failure = failure or exc
    if isinstance(failure, PushPullError):
        raise as_tensorflow_error(failure)
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


def _drain(started: Sequence[Union[_Pending, _GatherInFlight, _AdasumInFlight, _RowSparseInFlight]]) -> None:
    for item in started:
        pendings = [item] if isinstance(item, _Pending) else item.waiting()
        for pending in pendings:
            try:
                pending.wait()
            except BaseException:  # the original error matters more
                pass
