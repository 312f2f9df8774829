"""Horovod's collectives beyond allreduce and broadcast, for TensorFlow tensors, eager or in tf.function.

alltoall, reducescatter, grouped ops, allreduce by Min/Max/Product, objects
and process sets are computed by :mod:`byteps.common.frontend.collectives`;
this module turns tensors into its byte pieces and back and runs each call
eagerly or as one ``py_function`` op (:func:`byteps.tensorflow.graph_ops.run_eagerly`).
Ranks that disagree (dtype, trailing shape, splits) get
:class:`MismatchError` on every rank, which is TensorFlow's
``FailedPreconditionError`` (as Horovod raises it) and byteps'
``PushPullError`` at once.

Example::

    rows, splits = bps.alltoall(tf.range(4 * bps.size()), splits=[4] * bps.size())
    mine = bps.reducescatter(tf.ones([4 * bps.size(), 3]), op=bps.Sum)
    worst = bps.allreduce(loss, op=bps.Max)
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from byteps.common import PushPullError
from byteps.common.frontend import collectives as front
from byteps.common.frontend.objects import allgather_object as _allgather_object
from byteps.common.frontend.process_sets import rank_view
from byteps.common.frontend.reductions import BY_GATHER, Average, Sum, op_name
from byteps.tensorflow.graph_ops import run_eagerly
from byteps.tensorflow.ops import resolve_name
from byteps.tensorflow.reduction import InvalidArgument, MismatchError, as_tensorflow_error, key_name
from byteps.tensorflow.tensors import byteps_dtype, from_piece, to_piece

__all__ = ["MismatchError", "alltoall", "reducescatter", "grouped_reducescatter", "grouped_allgather",
           "reduce_by_gather", "allgather_object", "BY_GATHER", "run_collective"]

#: The allreduce ops computed from every rank's tensor rather than by the servers' sum.


def run_collective(body: Callable[..., List[tf.Tensor]], inputs: Sequence[Any], dtypes: Sequence[tf.DType],
                   shapes: Optional[Sequence[tf.TensorShape]] = None) -> List[tf.Tensor]:
    """``body`` eagerly or as one graph op; a failed collective raises :class:`MismatchError`."""
    def guarded(*tensors: tf.Tensor) -> List[tf.Tensor]:
        try:
            return body(*tensors)
        except PushPullError as exc:
            raise as_tensorflow_error(exc) from exc

    return run_eagerly(guarded, [tf.convert_to_tensor(t) for t in inputs], dtypes, shapes)


def _finish(started: front.Started) -> Any:
    started.core.wait()
    return started.finish()


def _rows_shape(tensor: tf.Tensor) -> tf.TensorShape:
    return tf.TensorShape([None]).concatenate(tensor.shape[1:]) if tensor.shape.rank else tf.TensorShape(None)


# --- alltoall -------------------------------------------------------------------------------


def alltoall(tensor: Any, splits: Any = None, name: Optional[str] = None, ignore_name_scope: bool = False,
             process_set: Any = None) -> Any:
    """Send ``splits[j]`` rows to the j-th rank and gather what the ranks sent here; differentiable.

    Returns the received tensor, and with ``splits`` also the received
    splits (int32, one entry per rank), as Horovod does.
    """
    view = rank_view(process_set)
    tensor = tf.convert_to_tensor(tensor)
    name = resolve_name("alltoall", name, tensor)
    if tensor.shape.rank == 0:
        raise ValueError("alltoall: a scalar (0-d) tensor cannot be split; give it a first dimension")
    inputs = [tensor] if splits is None else [tensor, tf.cast(tf.convert_to_tensor(splits), tf.int32)]

    def body(x: tf.Tensor, *given: tf.Tensor) -> List[tf.Tensor]:
        wanted = [int(v) for v in given[0].numpy()] if given else None
        try:
            started = front.alltoall(name, to_piece(x), wanted, view)
        except ValueError as exc:  # splits that do not fit the tensor: Horovod's InvalidArgumentError
            raise InvalidArgument(str(exc)) from exc
        piece, counts = _finish(started)
        return [from_piece(piece, x.dtype), tf.constant(counts, dtype=tf.int32)]

    def forward(x: tf.Tensor, *given: tf.Tensor) -> List[tf.Tensor]:
        return run_collective(body, [x, *given], [x.dtype, tf.int32], [_rows_shape(x), tf.TensorShape([view.size])])

    if tensor.dtype.is_floating:
        @tf.custom_gradient
        def differentiable(x: tf.Tensor):
            output, received = forward(x, *inputs[1:])

            def backward(upstream: Any, *_ignored: Any) -> tf.Tensor:
                back, _ = alltoall(tf.convert_to_tensor(upstream), received, name=f"{name}.grad",
                                   process_set=process_set)
                return back

            return (output, received), backward

        output, received = differentiable(tensor)
    else:
        output, received = forward(*inputs)
    return output if splits is None else (output, received)


# --- reducescatter ---------------------------------------------------------------------------


def _average(op: Any) -> bool:
    if op not in (Average, Sum):
        raise NotImplementedError(f"reducescatter: op must be Average or Sum, got {op_name(op)}")
    return op == Average


def _scaled(tensor: tf.Tensor, factor: float) -> tf.Tensor:
    """``tensor * factor`` as Horovod scales: integers in float64 (truncated), halves in float32."""
    if factor == 1.0:
        return tensor
    if tensor.dtype.is_floating and tensor.dtype.size >= 4:
        return tensor * tf.cast(factor, tensor.dtype)
    wide = tf.float32 if tensor.dtype.is_floating else tf.float64
    return tf.cast(tf.cast(tensor, wide) * tf.cast(factor, wide), tensor.dtype)


def grouped_reducescatter(tensors: Sequence[Any], device_dense: str = "", compression: Any = None, op: Any = Average,
                          name: Optional[str] = None, process_set: Any = None, ignore_name_scope: bool = False,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> List[tf.Tensor]:
    """Reduce each tensor over the ranks and keep this rank's rows of each (the first ``rows % size``
    ranks get a row more). Differentiable as in Horovod: the gradient is every rank's upstream
    gradient gathered (times ``size()`` for Sum)."""
    view = rank_view(process_set)
    average = _average(op)
    tensors = [_scaled(tf.convert_to_tensor(t), prescale_factor) for t in tensors]
    for tensor in tensors:
        if tensor.shape.rank == 0:
            raise ValueError("reducescatter: a scalar (0-d) tensor cannot be scattered; give it a first dimension")
        byteps_dtype(tensor.dtype, "reducescatter")
    base = resolve_name("reducescatter", name, tensors[0] if tensors else None)
    names = [base if len(tensors) == 1 else f"{base}.{i}" for i in range(len(tensors))]

    def body(*xs: tf.Tensor) -> List[tf.Tensor]:
        started = []
        for x, key in zip(xs, names):
            dtype = byteps_dtype(x.dtype, f"reducescatter({key!r})")
            array = np.ascontiguousarray(x.numpy()).view(dtype.storage)
            # One byteps tensor per (name, shape, dtype), as for allreduce (see byteps.tensorflow.reduction).
            started.append(front.reducescatter(key_name(key, array.shape, dtype, view.set_id), array, dtype, average,
                                               view))
        return [tf.convert_to_tensor(np.asarray(_finish(s)).view(x.dtype.as_numpy_dtype), dtype=x.dtype)
                for s, x in zip(started, xs)]

    shapes = [_rows_shape(t) for t in tensors]

    def forward(*xs: tf.Tensor) -> List[tf.Tensor]:
        return run_collective(body, list(xs), [x.dtype for x in xs], shapes)

    if not tensors:
        return []
    if all(t.dtype.is_floating for t in tensors):
        @tf.custom_gradient
        def differentiable(*xs: tf.Tensor):
            def backward(*upstream: Any) -> List[tf.Tensor]:
                # Horovod's gradient: every rank's upstream rows gathered, times size() for a Sum.
                from byteps.tensorflow.ops import allgather
                factor = 1.0 if average else float(view.size)
                return [allgather(_scaled(tf.convert_to_tensor(g), factor), name=f"{key}.grad",
                                  process_set=process_set) for g, key in zip(upstream, names)]

            return forward(*xs), backward

        results = list(differentiable(*tensors))
    else:
        results = forward(*tensors)
    return [_scaled(r, postscale_factor) for r in results]


def reducescatter(tensor: Any, device_dense: str = "", compression: Any = None, op: Any = Average,
                  name: Optional[str] = None, process_set: Any = None, ignore_name_scope: bool = False,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduce ``tensor`` over the ranks and keep this rank's rows."""
    return grouped_reducescatter([tensor], device_dense, compression, op, name, process_set, ignore_name_scope,
                                 prescale_factor, postscale_factor)[0]


# --- gathers ----------------------------------------------------------------------------------


def grouped_allgather(tensors: Sequence[Any], name: Optional[str] = None, ignore_name_scope: bool = False,
                      process_set: Any = None) -> List[tf.Tensor]:
    """:func:`byteps.tensorflow.allgather` of each tensor."""
    from byteps.tensorflow.ops import allgather
    base = name if name is not None else None
    return [allgather(t, None if base is None else f"{base}.{i}", process_set=process_set)
            for i, t in enumerate(tensors)]


def reduce_by_gather(tensor: Any, op: int, name: Optional[str], prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0, process_set: Any = None) -> tf.Tensor:
    """Allreduce by Min, Max, Product or Adasum, from every rank's tensor (not differentiable)."""
    view = rank_view(process_set)
    tensor = _scaled(tf.convert_to_tensor(tensor), prescale_factor)
    name = resolve_name("allreduce", name, tensor)

    def body(x: tf.Tensor) -> List[tf.Tensor]:
        compute = x.numpy()
        if x.dtype in (tf.float16, tf.bfloat16):
            compute = compute.astype(np.float32)
        piece = to_piece(tf.convert_to_tensor(compute))
        result = _finish(front.reduce_by_gather(name, piece, op, compute.dtype, view))
        return [tf.cast(tf.convert_to_tensor(result), x.dtype)]

    return _scaled(run_collective(body, [tensor], [tensor.dtype], [tensor.shape])[0], postscale_factor)


def allgather_object(obj: Any, session: Any = None, name: Optional[str] = None, process_set: Any = None) -> List[Any]:
    """Every rank's picklable ``obj``, in rank order, eagerly or in a TF1 graph (not inside tf.function: an
    object is gathered when the Python line runs). ``session`` is accepted for Horovod's signature."""
    if tf.inside_function():
        raise RuntimeError("allgather_object() gathers Python objects when called: call it outside tf.function")
    return _allgather_object(obj, name, process_set)
