"""Horovod's collectives beyond allreduce for NDArrays: allgather, alltoall, reducescatter, Min/Max/Product,
objects, process sets, through byteps-common's front (:mod:`byteps.common.frontend.collectives`).

Unlike the allreduce and broadcast of :mod:`byteps.mxnet.ops`, which queue
on MXNet's engine, these ops are synchronous: each reads its input (after
MXNet's pending writes to it), runs the collective and returns a new
NDArray on the input's context. The layouts, checks and results are the
front's, the same as in byteps.torch and byteps.tensorflow: a first
dimension may differ between ranks for allgather, ranks that disagree on a
dtype or trailing shape get a PushPullError on every rank, reducescatter
gives rank ``i`` Horovod's share of rows. Example::

    import mxnet as mx
    import byteps.mxnet as bps

    bps.init()
    rows = bps.allgather(mx.nd.ones((bps.rank() + 1, 3)))     # (1 + 2 + ... + size) x 3
    evens = bps.add_process_set([0, 2])
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Union

import mxnet as mx
import numpy as np

from byteps.common.frontend import collectives as front
from byteps.common.frontend.objects import allgather_object as _allgather_object
from byteps.common.frontend.objects import broadcast_object as _broadcast_object
from byteps.common.frontend.process_sets import rank_view
from byteps.common.frontend.reductions import Average, Sum, op_name
from byteps.mxnet.ops import _names
from byteps.mxnet.tensors import check_array, dtype_name, scaled

__all__ = ["allgather", "grouped_allgather", "alltoall", "reducescatter", "grouped_reducescatter",
           "allreduce_by_gather", "allgather_object", "broadcast_object", "InvalidArgument"]


class InvalidArgument(ValueError, mx.base.MXNetError):
    """Arguments an op finds wrong when it runs (alltoall splits that do not add up): a ValueError and, as
    Horovod's MXNet raises it from its engine op, an MXNetError."""


def _piece(array: mx.nd.NDArray, what: str) -> front.Piece:
    if not isinstance(array, mx.nd.NDArray):
        raise TypeError(f"{what}: expected an mxnet NDArray, got {type(array).__name__}")
    host = np.ascontiguousarray(array.asnumpy())  # waits for MXNet's pending writes to the array
    return front.Piece(host.reshape(-1).view(np.uint8), tuple(array.shape), dtype_name(array))


def _array(piece: front.Piece, like: mx.nd.NDArray) -> mx.nd.NDArray:
    values = piece.data.view(np.dtype(piece.dtype)).reshape(piece.shape)
    return mx.nd.array(values, ctx=like.context, dtype=piece.dtype)


def _run(family: str, name: Optional[str], start) -> Any:
    """Reserve the name, start the front's collective (``start(resolved_name)``), wait, finish."""
    resolved = _names.resolve(family, name)
    token = _names.reserve(resolved, f"{family}({resolved!r})")
    try:
        started = start(resolved)
        started.core.wait()
        return started.finish()
    finally:
        _names.release(resolved, token)


def allgather(tensor: mx.nd.NDArray, name: Optional[str] = None, process_set: Any = None) -> mx.nd.NDArray:
    """The ranks' arrays concatenated along the first dimension (which may differ between ranks)."""
    piece = _piece(tensor, "allgather")
    return _array(_run("allgather", name, lambda key: front.allgather(key, piece, rank_view(process_set))), tensor)


def grouped_allgather(tensors: Sequence[mx.nd.NDArray], name: Optional[str] = None,
                      process_set: Any = None) -> List[mx.nd.NDArray]:
    """:func:`allgather` of each array (names ``"<name>.<i>"``)."""
    base = _names.resolve("grouped_allgather", name)
    return [allgather(t, f"{base}.{i}", process_set) for i, t in enumerate(tensors)]


def alltoall(tensor: mx.nd.NDArray, splits: Any = None, name: Optional[str] = None,
             process_set: Any = None) -> Union[mx.nd.NDArray, Tuple[mx.nd.NDArray, mx.nd.NDArray]]:
    """Send ``splits[j]`` rows to the j-th rank (an even split without ``splits``); returns what arrived,
    and with ``splits`` also how many rows came from each rank, as Horovod's MXNet alltoall does."""
    piece = _piece(tensor, "alltoall")
    if isinstance(splits, mx.nd.NDArray):
        if dtype_name(splits) != "int32":
            raise InvalidArgument(f"alltoall: splits must be an int32 array (Horovod's rule), got {dtype_name(splits)}")
        splits = splits.asnumpy()
    if splits is not None:
        splits = [int(s) for s in splits]
    try:
        received, counts = _run("alltoall", name,
                                lambda key: front.alltoall(key, piece, splits, rank_view(process_set)))
    except ValueError as exc:  # splits that do not fit the array
        raise InvalidArgument(str(exc)) from exc
    if splits is None:
        return _array(received, tensor)
    return _array(received, tensor), mx.nd.array(counts, dtype="int32")


def _average(op: Any) -> bool:
    if op not in (Average, Sum):
        raise ValueError(f"reducescatter: op must be Average or Sum, got {op_name(op)}")
    return op == Average


def reducescatter(tensor: mx.nd.NDArray, name: Optional[str] = None, op: Any = Average,
                  process_set: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                  priority: int = 0) -> mx.nd.NDArray:
    """This rank's rows of the ranks' average (or sum): the first ``rows % n`` ranks get one row more.

    ``prescale_factor`` multiplies the input, ``postscale_factor`` this rank's rows (integers in float64,
    float16 in float32, as Horovod). ``priority`` is accepted for Horovod's signature.
    """
    average = _average(op)
    check_array(tensor, "reducescatter")
    # asnumpy() gives a new C-ordered array; np.ascontiguousarray would turn a 0-d one into 1-d
    host = scaled(tensor, prescale_factor).asnumpy()
    dtype = dtype_name(tensor)
    rows = _run("reducescatter", name,
                lambda key: front.reducescatter(_names.key(key, (host.shape, dtype), rank_view(process_set).set_id),
                                                host, dtype, average, rank_view(process_set)))
    return scaled(mx.nd.array(rows, ctx=tensor.context, dtype=dtype), postscale_factor)


def grouped_reducescatter(tensors: Sequence[mx.nd.NDArray], name: Optional[str] = None, op: Any = Average,
                          process_set: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                          priority: int = 0) -> List[mx.nd.NDArray]:
    """:func:`reducescatter` of each array (names ``"<name>.<i>"``)."""
    base = _names.resolve("grouped_reducescatter", name)
    return [reducescatter(t, f"{base}.{i}", op, process_set, prescale_factor, postscale_factor)
            for i, t in enumerate(tensors)]


def allreduce_by_gather(tensor: mx.nd.NDArray, op: int, name: Optional[str] = None,
                        process_set: Any = None) -> mx.nd.NDArray:
    """Min, Max, Product or Adasum over the ranks (every rank's array gathered, reduced here; the front
    refuses other ops)."""
    piece = _piece(tensor, f"allreduce(op={op_name(op)})")
    result = _run("allreduce", name, lambda key: front.reduce_by_gather(
        key, piece, op, np.dtype(piece.dtype), rank_view(process_set)))
    return mx.nd.array(result, ctx=tensor.context, dtype=piece.dtype)


def allgather_object(obj: Any, name: Optional[str] = None, process_set: Any = None) -> List[Any]:
    """Every rank's picklable ``obj``, in rank order."""
    return _allgather_object(obj, name, process_set)


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None, process_set: Any = None) -> Any:
    """``obj`` of ``root_rank`` (picklable), on every rank."""
    return _broadcast_object(obj, root_rank, name, process_set)
