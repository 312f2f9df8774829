"""push_pull, allreduce and broadcast of NDArrays, in BytePS's and Horovod's names.

Every op here is asynchronous the way MXNet's own operators are: it returns
at once, runs on MXNet's engine after the pending writes of its input, and
every MXNet operation issued later on its result (or on the array it works
in place) waits for it. A failure is raised by MXNet from the next read of
the result (``wait_to_read()``, ``asnumpy()``), as ``MXNetError`` with
byteps' message. See :mod:`byteps.mxnet.engine` for how.

Example (``bpslaunch -np 2 -- python train.py``)::

    import mxnet as mx
    import byteps.mxnet as bps

    bps.init()
    x = mx.nd.ones((3,)) * bps.rank()
    bps.byteps_push_pull(x, name="x", is_average=False)    # in place, returns at once
    y = x * 2                                               # runs after the push_pull
    z = bps.allreduce(x, name="x.mean")                     # new array: the average over ranks
    print(z.asnumpy())                                      # waits for it

Rules every rank must follow, as in BytePS and Horovod:

* All ranks issue the same ops, with the same names, shapes and dtypes.
  Ops of one name run in the order they were issued; ops of different
  names may complete in any order. A tensor name's id is fixed when it is
  first issued (or declared with :func:`byteps_declare_tensor`), so ranks
  must issue (or declare) new names in the same order. A name may be used
  again with another shape or dtype: it then maps to another byteps tensor,
  ``"<name>#<k>"`` in order of first use.
* ``name=None`` gives ``"<op>.noname.<n>"`` from a per-process counter per
  op: the same on every rank only if all ranks issue their unnamed ops in
  the same order. Servers keep buffers per name for the whole job, so name
  anything done every step.
* :func:`shutdown` does not wait for ops still running: they fail. Wait for
  your results (``mx.nd.waitall()``) before it.

Averages divide by the number of worker processes; integer arrays use floor
division (``-3 // 2 == -2``). ``priority`` is handed to MXNet's engine, which
runs ready ops of higher priority first (BytePS gives gradient *i* priority
``-i``, so the first layers' gradients, needed first by the next forward
pass, go first); byteps' own queue has no priorities yet.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence

import mxnet as mx
import numpy as np

from byteps.common import api
from byteps.common.frontend.checks import check_scale
from byteps.common.frontend.group import declare_group, push_pull_group
from byteps.common.frontend.names import TensorNames
from byteps.common.frontend.process import after_shutdown, before_shutdown, on_init, rank
from byteps.common.frontend.process_sets import broadcast_spec, rank_view, reduction_spec
from byteps.common.frontend.reductions import BY_GATHER, OpSpec, average_of, op_name
from byteps.common.handle import all_done
from byteps.mxnet.engine import EngineBridge
from byteps.mxnet.tensors import (
    NARROW_INTEGERS,
    check_array,
    dtype_name,
    empty_like,
    on_host,
    scale_,
    scaled,
    zeros_like,
)

__all__ = [
    "byteps_declare_tensor", "byteps_push_pull", "allreduce", "allreduce_", "broadcast", "broadcast_",
    "grouped_allreduce", "grouped_allreduce_",
]

_bridge = EngineBridge()
_names = TensorNames(settle=lambda key: _token(key).wait_to_read())  # a switch is announced after the ops issued
_tokens_lock = threading.Lock()
_tokens: Dict[str, mx.nd.NDArray] = {}
_skipping = threading.local()  # skipping_round() on the thread that issues ops


def _forget() -> None:
    _names.forget()
    with _tokens_lock:
        _tokens.clear()


# Ops not yet handed to byteps fail with a clear reason before the worker leaves; ops in flight fail then.
on_init(_bridge.open)
before_shutdown(lambda: _bridge.close("byteps.mxnet was shut down before this push_pull started"))
after_shutdown(_forget)


@contextlib.contextmanager
def skipping_round() -> Iterator[None]:
    """Backup workers: the ops this thread issues inside pull their round's average without pushing.

    byteps-common's :meth:`~byteps.common.worker.Worker.skipping_round`
    marks the push_pulls its own thread starts, but an op here starts its
    push_pull later, on the submitter thread, once MXNet's engine has run
    its ready op: so the mark is taken when the op is issued and carried to
    that thread. Each op must be an uncompressed average over every worker
    of a round that closed without this worker (the core refuses others;
    MXNet raises the refusal from the next read of the op's result).
    """
    _skipping.on = True
    try:
        yield
    finally:
        _skipping.on = False


def _as_issued(start: Any) -> Any:
    """``start``, inside the core's skipping_round() on the submitter thread when issued in :func:`skipping_round`."""
    if not getattr(_skipping, "on", False):
        return start

    def skipped(arrays, dtype):
        with api.worker().skipping_round():
            return start(arrays, dtype)

    return skipped


def byteps_declare_tensor(name: str) -> int:
    """Fix the id of tensor ``name`` ahead of its first push_pull; returns the id (as in BytePS)."""
    return api.declare(name)


def _key_name(name: str, array: mx.nd.NDArray, set_id: int = 0) -> str:
    """The byteps tensor behind a name: one per (shape, dtype) it is used with, ``"<name>#<k>"`` after the first
    (a switch of layout is announced to the ranks of process set ``set_id``)."""
    return _names.key(name, (tuple(array.shape), dtype_name(array)), set_id)


def _token(key: str) -> mx.nd.NDArray:
    """The array every op of ``key`` writes, so MXNet runs the ops of one name in the order issued."""
    with _tokens_lock:
        token = _tokens.get(key)
        if token is None:
            token = _tokens[key] = mx.nd.zeros((1,), ctx=mx.cpu())
    return token


def submit(tensor: mx.nd.NDArray, spec: OpSpec, inplace: bool, contribute: bool = True,
           compression_spec: Any = None, lr: Optional[float] = None) -> mx.nd.NDArray:
    """Issue one op on MXNet's engine; returns its result array (``tensor`` itself if ``inplace``).

    ``contribute=False`` pushes zeros instead of ``tensor`` (the non-root
    ranks of a broadcast). ``compression_spec`` (BytePS's compression_params,
    parsed: a :class:`byteps.common.compression.CompressionSpec`) compresses it
    on the way to the servers; ``lr``, the optimizer's learning rate when the
    op is issued, rescales error feedback.
    """
    name = _names.resolve(spec.family, spec.name)
    what = f"{spec.family}({name!r})"
    check_array(tensor, what)
    dtype = dtype_name(tensor)
    if compression_spec is not None and compression_spec.compressor != "none" and not dtype.startswith("float"):
        raise ValueError(f"{what}: compression_params {compression_spec.compressor!r} takes float16, float32 or "
                         f"float64 arrays, not {dtype}")
    worker = api.worker()
    key = _key_name(name, tensor, spec.set_id)
    options = spec.push_pull_options(compression=compression_spec, lr=lr)
    worker.declare(key)  # ids follow the order ops are issued, not the order they become ready
    if options.members is None:
        # With backup workers a sum or broadcast goes under a tensor of its own (the core's name_for): declared
        # here too, or the submitter thread would declare it in the order ops become ready, which differs
        # between ranks (the servers then refuse mismatched tensors).
        core = worker.tasks.name_for(key, worker.tasks.closes_early(options))
        if core != key:
            worker.declare(core)
    # Staging (unverified, see tensors.py): MXNet's engine orders the copies around the op.
    work = tensor if on_host(tensor) else tensor.copyto(mx.cpu())
    if inplace:
        if not contribute:
            zeros_like(work).copyto(work)
        else:
            scale_(work, spec.prescale)
        reads, result = [], work
    else:
        source = zeros_like(work) if not contribute else scaled(work, spec.prescale)
        reads, result = [source], empty_like(work)

    def start(arrays, dtype):
        output = arrays[1] if len(arrays) > 1 else None
        return worker.push_pull_async(arrays[0], key, options.replace(output=output, dtype=dtype))

    _bridge.submit(reads, [result], _token(key), spec.priority, key, what, _as_issued(start))
    scale_(result, spec.postscale)
    if work is tensor:
        return result
    if inplace:
        result.copyto(tensor)
        return tensor
    return result.as_in_context(tensor.context)


def allreduce_group_(tensors: Sequence[mx.nd.NDArray], names: Sequence[str], average: bool = True,
                     priority: int = 0, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0, compression_spec: Any = None,
                     lr: Optional[float] = None) -> List[mx.nd.NDArray]:
    """In-place :func:`allreduce_` of several arrays as one engine op, small ones fused; returns them.

    The op waits for every array's pending writes, then hands them all to
    byteps-common's grouped push_pull (:func:`byteps.common.frontend.group.push_pull_group`),
    which packs the small ones into buckets of at most BYTEPS_FUSION_THRESHOLD
    bytes. Every rank must make the same call (names, shapes, dtypes, order).
    ``compression_spec`` and ``lr``: BytePS's gradient compression of the
    arrays large enough for it, each compressed alone (fused apart).
    """
    worker = api.worker()
    keys, works = [], []
    for name, tensor in zip(names, tensors):
        name = _names.resolve("allreduce", name)
        what = f"allreduce({name!r})"
        check_array(tensor, what)
        keys.append(_key_name(name, tensor))
        worker.declare(keys[-1])
        work = tensor if on_host(tensor) else tensor.copyto(mx.cpu())
        scale_(work, prescale_factor)
        works.append(work)
    if not works:
        return []
    # The buckets' ids too, here in the caller's order: declared when the engine runs the op, they raced the
    # caller's next declarations and could differ between ranks (a hang; docs/decisions.md).
    declare_group(worker, keys, [work.size * np.dtype(work.dtype).itemsize for work in works],
                  [np.dtype(work.dtype) for work in works], compression_spec)
    group = f"group:{keys[0]}+{len(keys)}"

    def start(arrays, dtype):
        return all_done(push_pull_group(arrays, keys, average, compression_spec=compression_spec, lr=lr), group)

    _bridge.submit([], works, _token(group), priority, group, f"allreduce_group({group!r})", _as_issued(start))
    for work, tensor in zip(works, tensors):
        scale_(work, postscale_factor)
        if work is not tensor:
            work.copyto(tensor)
    return list(tensors)


# --- BytePS names ----------------------------------------------------------------------


def byteps_push_pull(tensor: mx.nd.NDArray, version: int = 0, priority: int = 0, name: Optional[str] = None,
                     is_average: bool = True) -> None:
    """Sum (or average) ``tensor`` over all ranks, in place; returns at once, as in BytePS.

    ``version`` is accepted for BytePS compatibility and ignored; ``priority``
    orders ready ops on MXNet's engine.

    >>> bps.byteps_push_pull(x, name="x", is_average=False); x.wait_to_read()
    """
    submit(tensor, OpSpec("push_pull", name, bool(is_average), priority=priority), inplace=True)


# --- Horovod names ---------------------------------------------------------------------


def allreduce(tensor: mx.nd.NDArray, average: Optional[bool] = None, name: Optional[str] = None, priority: int = 0,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0, op: Optional[int] = None,
              process_set: Any = None) -> mx.nd.NDArray:
    """A new array: ``tensor`` averaged (default) or summed over all ranks (or ``process_set``'s).

    ``prescale_factor`` multiplies the input before the reduction,
    ``postscale_factor`` the result after it (floating-point arrays only).
    ``op=Min``, ``Max`` or ``Product`` gathers every rank's array and
    reduces here, synchronously (:func:`byteps.mxnet.collectives.allreduce_by_gather`).
    """
    if op in BY_GATHER:
        from byteps.mxnet.collectives import allreduce_by_gather
        check_scale(prescale_factor, postscale_factor, False, f"allreduce(op={op_name(op)})", op_name(op),
                    needed="op=Average or Sum")
        return allreduce_by_gather(tensor, op, name, process_set)
    spec = reduction_spec("allreduce", name, op, average, prescale_factor, postscale_factor, process_set, priority)
    return submit(tensor, spec, inplace=False)


def allreduce_(tensor: mx.nd.NDArray, average: Optional[bool] = None, name: Optional[str] = None, priority: int = 0,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0, op: Optional[int] = None,
               process_set: Any = None, *, compression_spec: Any = None,
               lr: Optional[float] = None) -> mx.nd.NDArray:
    """:func:`allreduce` into ``tensor`` itself; returns it.

    ``compression_spec`` and ``lr``: BytePS's gradient compression, as
    DistributedTrainer's ``compression_params`` uses it (see :func:`submit`).
    """
    if op in BY_GATHER:
        return allreduce(tensor, name=name, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                         op=op, process_set=process_set).copyto(tensor)
    spec = reduction_spec("allreduce", name, op, average, prescale_factor, postscale_factor, process_set, priority)
    return submit(tensor, spec, inplace=True, compression_spec=compression_spec, lr=lr)


def grouped_allreduce_(tensors: Sequence[mx.nd.NDArray], average: Optional[bool] = None, name: Optional[str] = None,
                       priority: int = 0, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: Any = None, op: Optional[int] = None) -> List[mx.nd.NDArray]:
    """Horovod's: :func:`allreduce_` of every array, in place, as one engine op (small ones fused); returns them.

    Array *i* is named ``"<name>.<i>"`` (unnamed without ``name``). Min, Max, Product and Adasum reduce
    each array from every rank's (synchronously). Over a process set each array is its own op (fusion
    packs the arrays of collectives over every rank).
    """
    tensors = list(tensors)
    names = [None if name is None else f"{name}.{i}" for i in range(len(tensors))]
    if op in BY_GATHER or rank_view(process_set).set_id:
        for tensor, key in zip(tensors, names):
            allreduce_(tensor, average, key, priority, prescale_factor, postscale_factor, op, process_set)
        return tensors
    return allreduce_group_(tensors, names, average_of(op, average), priority, prescale_factor, postscale_factor)


def grouped_allreduce(tensors: Sequence[mx.nd.NDArray], average: Optional[bool] = None, name: Optional[str] = None,
                      priority: int = 0, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: Any = None, op: Optional[int] = None) -> List[mx.nd.NDArray]:
    """Horovod's: :func:`grouped_allreduce_` into new arrays; the inputs are left as they are."""
    return grouped_allreduce_([tensor.copy() for tensor in tensors], average, name, priority, prescale_factor,
                              postscale_factor, process_set, op)


def _broadcast(tensor: mx.nd.NDArray, root_rank: int, name: Optional[str], priority: int,
               inplace: bool, process_set: Any = None) -> mx.nd.NDArray:
    spec = broadcast_spec(root_rank, name, process_set, priority)
    contribute = rank() == root_rank
    if not isinstance(tensor, mx.nd.NDArray) or dtype_name(tensor) not in NARROW_INTEGERS:
        return submit(tensor, spec, inplace, contribute)
    wide = tensor.astype("int32")
    submit(wide, spec, inplace=True, contribute=contribute)
    narrow = wide.astype(tensor.dtype)
    if not inplace:
        return narrow
    narrow.copyto(tensor)
    return tensor


def broadcast(tensor: mx.nd.NDArray, root_rank: int, name: Optional[str] = None, priority: int = 0,
              process_set: Any = None) -> mx.nd.NDArray:
    """A new array holding the root's ``tensor`` on every rank of ``process_set`` (default: all; BytePS's way:
    the others push zeros). Ranks that name different roots fail, on every rank."""
    return _broadcast(tensor, root_rank, name, priority, False, process_set)


def broadcast_(tensor: mx.nd.NDArray, root_rank: int, name: Optional[str] = None, priority: int = 0,
               process_set: Any = None) -> mx.nd.NDArray:
    """Overwrite ``tensor`` on every rank (of ``process_set``) with the root's; returns it."""
    return _broadcast(tensor, root_rank, name, priority, True, process_set)
