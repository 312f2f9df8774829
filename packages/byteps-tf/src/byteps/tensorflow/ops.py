"""push_pull, allreduce, broadcast and allgather of TensorFlow tensors, eager or in tf.function.

Example (``bpslaunch -np 2 -- python train.py``)::

    import tensorflow as tf
    import byteps.tensorflow as bps

    bps.init()
    x = tf.fill([3], float(bps.rank()))
    bps.push_pull(x, name="x")                      # the average over ranks
    bps.allreduce(x, op=bps.Sum, name="x.sum")       # Horovod's name and signature

    @tf.function
    def step(x):
        return bps.allreduce(x, name="in.graph")     # works inside tf.function too

Rules every rank follows, as in Horovod and BytePS:

* All ranks issue the same ops with the same names, shapes and dtypes in the
  same order. The servers refuse a rank whose tensor differs from the others'
  under one name, and every rank's op then fails (``PushPullError``) naming
  both descriptions. A name may be used again with another shape or dtype.
* ``name=None``: eagerly, ``"<op>.noname.<n>"`` from a per-process counter per
  op (the same on every rank that issues its unnamed ops in the same order);
  inside ``tf.function``, ``"<op>.<graph name of the tensor>"``, which is fixed
  by the traced code, so it does not depend on how often a rank retraced.
* Averages divide by the number of worker processes; integer tensors use
  floor division (``-3 // 2 == -2``), as byteps-common does.
* ``tf.IndexedSlices`` are reduced by gathering every rank's values and
  indices (``allgather``), as Horovod does; averaging divides the values.
"""

from __future__ import annotations

from typing import Any, List, Optional

import numpy as np
import tensorflow as tf

from byteps.common.frontend.checks import check_root
from byteps.common.frontend.collectives import RankView
from byteps.common.frontend.process import rank, size
from byteps.common.frontend.process_sets import ProcessSet, broadcast_view, global_process_set, rank_view
from byteps.common.frontend.reductions import BY_GATHER, Average, Sum, average_of, op_name
from byteps.tensorflow.compression import Compression
from byteps.tensorflow.graph_ops import run_group
from byteps.tensorflow.reduction import Gather, Reduce, key_name, tensor_names
from byteps.tensorflow.tensors import byteps_dtype, widen

__all__ = [
    "push_pull", "allreduce", "broadcast", "allgather", "average_of", "resolve_name", "check_process_set",
]


def check_process_set(process_set: Any) -> None:
    """For the gradient wrappers: None, the global set or a registered ProcessSet (this rank need not be in it)."""
    if process_set is None or process_set is global_process_set:
        return
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"process_set must be a ProcessSet, got {type(process_set).__name__}")
    if process_set.included():
        rank_view(process_set)  # registered?
    elif process_set.process_set_id is None:
        raise ValueError(f"{process_set} is not registered: add it with add_process_set() (or "
                         "init(process_sets=...)) on every rank first")


def _in_set(process_set: Any) -> Optional[RankView]:
    """The view of a process set other than the global one, else None (checked either way)."""
    view = rank_view(process_set)
    return view if view.set_id else None


def _reduce_in_set(tensor: tf.Tensor, name: str, average: bool, view: RankView, root: Optional[int] = None) -> Any:
    """Sum, average or (``root``) broadcast ``tensor`` among a process set's ranks only."""
    from byteps.tensorflow.collectives import run_collective
    byteps_dtype(tensor.dtype, f"allreduce({name!r})")

    def body(x: tf.Tensor) -> List[tf.Tensor]:
        dtype = byteps_dtype(x.dtype, f"allreduce({name!r})")
        array = np.array(x.numpy()).view(dtype.storage)
        if root is not None and rank() != root:
            array[...] = 0
        view.push_pull(key_name(name, array.shape, dtype, view.set_id), array, average=average, dtype=dtype, root=root)
        return [tf.convert_to_tensor(array.view(x.dtype.as_numpy_dtype), dtype=x.dtype)]

    return run_collective(body, [tensor], [tensor.dtype], [tensor.shape])[0]


def resolve_name(family: str, name: Optional[str], tensor: Any) -> str:
    """The user's name, or a default that is the same on every rank (see the module doc)."""
    if name is None and not tf.executing_eagerly():
        graph_name = getattr(tensor, "name", None)
        if graph_name:
            return f"{family}.{graph_name}"
    return tensor_names.resolve(family, name)


try:  # whether a GradientTape could record an op now; internal, hence the safe fallback
    from tensorflow.python.eager.record import could_possibly_record as _tape_may_record
except ImportError:  # pragma: no cover - depends on TensorFlow's internals
    def _tape_may_record() -> bool:
        return True


def _reduce_one(tensor: tf.Tensor, spec: Reduce) -> tf.Tensor:
    return run_group([spec], [tensor])[0]


def _differentiable(tensor: tf.Tensor, spec: Reduce, gradient: Reduce,
                    gradient_root: Optional[int] = None) -> tf.Tensor:
    """Reduce ``tensor``; its gradient is ``gradient`` applied to the upstream gradient.

    With ``gradient_root``, ranks other than that one get a zero gradient
    (Horovod's gradient of a broadcast).
    """
    if not tensor.dtype.is_floating or (tf.executing_eagerly() and not _tape_may_record()):
        # Nothing can differentiate it: skip tf.custom_gradient, which costs
        # more than a small push_pull eagerly.
        return _reduce_one(tensor, spec)

    @tf.custom_gradient
    def forward(x: tf.Tensor):
        def backward(upstream: Any) -> tf.Tensor:
            reduced = _reduce_one(tf.convert_to_tensor(upstream), gradient)
            if gradient_root is not None:
                # The same ops on every rank: graph tensor names (default byteps names) stay rank-independent.
                return reduced * tf.cast(rank() == gradient_root, reduced.dtype)
            return reduced

        return _reduce_one(x, spec), backward

    return forward(tensor)


def _differentiable_group(tensors: List[tf.Tensor], names: List[str], average: bool) -> List[tf.Tensor]:
    """Reduce ``tensors`` as one group (fused where small); the gradient is the same group reduction."""
    specs = [Reduce(n, average) for n in names]
    if not all(t.dtype.is_floating for t in tensors) or (tf.executing_eagerly() and not _tape_may_record()):
        return run_group(specs, tensors)

    @tf.custom_gradient
    def forward(*xs: tf.Tensor):
        def backward(*upstream: Any) -> List[tf.Tensor]:
            return run_group([Reduce(n + ".grad", average) for n in names], [tf.convert_to_tensor(u) for u in upstream])

        return run_group(specs, list(xs)), backward

    return list(forward(*tensors))


def _allreduce(family: str, tensor: Any, average: bool, name: Optional[str], compression: Any,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None) -> Any:
    view = _in_set(process_set)
    if isinstance(tensor, tf.IndexedSlices):
        return _allreduce_slices(family, tensor, average, name, prescale_factor, postscale_factor, view)
    from byteps.tensorflow.collectives import _scaled
    tensor = tf.convert_to_tensor(tensor)
    name = resolve_name(family, name, tensor)
    what = f"{family}({name!r})"
    narrow = widen(tensor.dtype) != tensor.dtype and tensor.dtype != tf.bool
    if not narrow:
        byteps_dtype(tensor.dtype, what)
    sent = _scaled(tensor, prescale_factor)
    if narrow:  # int8/uint8/int16/uint16/uint32: summed exactly in a wider integer, wrapped back on the way out
        sent = tf.cast(sent, widen(tensor.dtype))
    sent, ctx = compression.compress(sent)
    byteps_dtype(sent.dtype, what)
    if view is not None:
        reduced = _reduce_in_set(sent, name, average, view)
    else:
        reduced = _differentiable(sent, Reduce(name, average), Reduce(name + ".grad", average))
    reduced = compression.decompress(reduced, ctx)
    if narrow:
        reduced = tf.cast(reduced, tensor.dtype)
    return _scaled(reduced, postscale_factor)


def _allreduce_slices(family: str, slices: tf.IndexedSlices, average: bool, name: Optional[str],
                      prescale_factor: float, postscale_factor: float,
                      view: Optional[RankView] = None) -> tf.IndexedSlices:
    """Horovod's reduction of IndexedSlices: gather the ranks' values and indices (duplicates add up).

    An average divides the gathered values with TensorFlow's ``/``, as
    Horovod does: integer values become float64 (``tf.math.truediv``).
    ``prescale_factor`` scales each rank's values before the gather,
    ``postscale_factor`` the gathered ones (Horovod refuses both here; the
    result is the same as scaling the dense sum)."""
    from byteps.tensorflow.collectives import _scaled
    name = resolve_name(family, name, slices.values)
    sent = _scaled(tf.convert_to_tensor(slices.values), prescale_factor)
    values, indices, _ = run_group([Gather(name, parts=2, view=view)], [sent, slices.indices])
    if average:
        values = values / tf.cast(size() if view is None else len(view.ranks), values.dtype)
    return tf.IndexedSlices(_scaled(values, postscale_factor), indices, dense_shape=slices.dense_shape)


def push_pull(tensor: Any, average: bool = True, name: Optional[str] = None, compression: Any = Compression.none,
              op: Optional[int] = None, *, scope: str = "", device_dense: str = "", device_sparse: str = "") -> Any:
    """Average (or sum) ``tensor`` over all workers; differentiable (BytePS's name).

    ``op`` (Average/Sum), when given, supersedes ``average``. ``scope``
    prefixes the name (BytePS); the device arguments are accepted and ignored.

    >>> bps.push_pull(tf.ones(3), average=False, name="ones")   # [2., 2., 2.] with 2 workers
    """
    if scope and name is not None:
        name = f"{scope}.{name}"
    return _allreduce("push_pull", tensor, average_of(op, None if op is not None else average), name, compression)


def allreduce(tensor: Any, average: Optional[bool] = None, device_dense: str = "", device_sparse: str = "",
              compression: Any = Compression.none, op: Optional[int] = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: Optional[str] = None, process_set: Any = None,
              ignore_name_scope: bool = False) -> Any:
    """Horovod's allreduce: average (default) or sum over all workers; differentiable.

    ``prescale_factor`` multiplies the input before the reduction,
    ``postscale_factor`` the result after it (integers scale in float64 and
    truncate, float16 in float32, as Horovod's). A ``tf.IndexedSlices``
    gives a ``tf.IndexedSlices`` holding every rank's values (scaled) and
    indices (Average or Sum only, as in Horovod: another op is a
    NotImplementedError naming them).
    """
    if isinstance(tensor, tf.IndexedSlices) and op is not None and op not in (Average, Sum):
        raise NotImplementedError(f"allreduce of tf.IndexedSlices: only Average and Sum are supported, "
                                  f"not {op_name(op)} (as in Horovod); for {op_name(op)}, pass "
                                  "tf.convert_to_tensor(slices)")
    if op in BY_GATHER:
        from byteps.tensorflow.collectives import reduce_by_gather
        if average is not None:
            raise ValueError("the op parameter supersedes average: pass only one of them")
        return reduce_by_gather(tensor, op, name, prescale_factor, postscale_factor, process_set)
    return _allreduce("allreduce", tensor, average_of(op, average), name, compression, prescale_factor,
                      postscale_factor, process_set)


def _check_root(root_rank: Any) -> None:
    check_root(root_rank, size())


def broadcast(tensor: Any, root_rank: int, name: Optional[str] = None, ignore_name_scope: bool = False,
              process_set: Any = None) -> tf.Tensor:
    """The root's ``tensor`` on every rank; differentiable (Horovod's gradient: the averaged
    gradient on the root, zeros elsewhere).

    BytePS's broadcast: the root pushes its tensor, every other rank zeros.
    bool and 8/16-bit integers travel as int32, uint32 as int64 (exact).
    """
    view = broadcast_view(root_rank, process_set)
    view = view if view.set_id else None  # a process set other than the global one
    tensor = tf.convert_to_tensor(tensor)
    name = resolve_name("broadcast", name, tensor)
    sent = tensor
    if widen(tensor.dtype) != tensor.dtype:
        sent = tf.cast(tensor, widen(tensor.dtype))
    byteps_dtype(sent.dtype, f"broadcast({name!r})")
    if view is not None:
        result = _reduce_in_set(sent, name, False, view, root=int(root_rank))
        return result if result.dtype == tensor.dtype else tf.cast(result, tensor.dtype)
    contribute = rank() == root_rank
    result = _differentiable(sent, Reduce(name, average=False, contribute=contribute, root=int(root_rank)),
                             Reduce(name + ".grad", average=True), gradient_root=int(root_rank))
    return result if result.dtype == tensor.dtype else tf.cast(result, tensor.dtype)


def allgather(tensor: Any, name: Optional[str] = None, ignore_name_scope: bool = False,
              process_set: Any = None) -> tf.Tensor:
    """Concatenate every rank's ``tensor`` along the first dimension, in rank order.

    The first dimension may differ between ranks; the others must not.
    Built on push_pull (byteps servers only sum; see
    :mod:`byteps.common.frontend.collectives`), for any dtype. Differentiable
    as in Horovod: the gradient of each rank's rows is the *average* over the
    ranks of the upstream gradient's rows.
    """
    view = _in_set(process_set)
    tensor = tf.convert_to_tensor(tensor)
    if tensor.shape.rank == 0:
        raise ValueError("allgather: the tensor needs at least one dimension")
    name = resolve_name("allgather", name, tensor)
    spec = Gather(name, view=view)
    if not tensor.dtype.is_floating:
        return run_group([spec], [tensor])[0]

    @tf.custom_gradient
    def forward(x: tf.Tensor):
        gathered, counts = run_group([spec], [x])

        def backward(upstream: Any) -> tf.Tensor:
            upstream = tf.convert_to_tensor(upstream)
            if view is not None:
                averaged = _reduce_in_set(upstream, name + ".grad", True, view)
            else:
                averaged = _reduce_one(upstream, Reduce(name + ".grad", average=True))
            offset = tf.reduce_sum(counts[:rank() if view is None else view.position])
            return averaged[offset:offset + tf.shape(x, out_type=tf.int64)[0]]

        return gathered, backward

    return forward(tensor)
