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

import atexit
import dataclasses
import itertools
import threading
from typing import Dict, List, Optional, Tuple

import mxnet as mx

from byteps.common import api
from byteps.mxnet.engine import EngineBridge
from byteps.mxnet.tensors import NARROW_INTEGERS, check_array, dtype_name, empty_like, on_host, zeros_like

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
    "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "byteps_declare_tensor", "byteps_push_pull", "allreduce", "allreduce_", "broadcast", "broadcast_",
]

# Reduction ops with Horovod's values; byteps reduces by Average and Sum only.
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max", Product: "Product"}

_bridge = EngineBridge()
_names_lock = threading.Lock()
_noname_counters: Dict[str, itertools.count] = {}
_layouts: Dict[str, List[Tuple[Tuple[int, ...], str]]] = {}
_tokens: Dict[str, mx.nd.NDArray] = {}


def init() -> None:
    """Join the job that ``bpslaunch`` describes in the environment. Idempotent."""
    api.init()
    _bridge.open()


def shutdown() -> None:
    """Leave the job (also runs at exit). Ops still running fail; wait for them first (``mx.nd.waitall()``)."""
    _bridge.close("byteps.mxnet was shut down before this push_pull started")
    api.shutdown()
    with _names_lock:
        _layouts.clear()
        _tokens.clear()


# Registered after byteps.common's own exit hook, so it runs before it.
atexit.register(shutdown)


def is_initialized() -> bool:
    return api.is_initialized()


def size() -> int:
    """Number of worker processes in the job."""
    return api.size()


def rank() -> int:
    """This process's rank, 0 .. size()-1."""
    return api.rank()


def local_size() -> int:
    """Number of worker processes on this machine."""
    return api.local_size()


def local_rank() -> int:
    """This process's rank among the worker processes of its machine."""
    return api.local_rank()


def byteps_declare_tensor(name: str) -> int:
    """Fix the id of tensor ``name`` ahead of its first push_pull; returns the id (as in BytePS)."""
    return api.declare(name)


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """What to do with one array: op family, name, averaging, engine priority and scaling."""

    family: str
    name: Optional[str]
    average: bool
    priority: int = 0
    prescale: float = 1.0
    postscale: float = 1.0


def average_of(op: Optional[int], average: Optional[bool], default: bool = True) -> bool:
    """Horovod's rule: ``op`` supersedes ``average``; Adasum and the rest are not supported."""
    if op is None:
        return default if average is None else bool(average)
    if average is not None:
        raise ValueError("the op parameter supersedes average: pass only one of them")
    if op == Average:
        return True
    if op == Sum:
        return False
    raise NotImplementedError(
        f"op={_OP_NAMES.get(op, op)} is not supported by byteps, whose servers sum: use op=Average or op=Sum")


def _resolve_name(family: str, name: Optional[str]) -> str:
    if name is None:
        with _names_lock:
            counter = _noname_counters.setdefault(family, itertools.count())
            return f"{family}.noname.{next(counter)}"
    if not isinstance(name, str) or not name:
        raise ValueError(f"{family}: a name must be a non-empty string, got {name!r}")
    return name


def _key_name(name: str, array: mx.nd.NDArray) -> str:
    """The byteps tensor behind a name: one per (shape, dtype) it is used with, ``"<name>#<k>"`` after the first."""
    layout = (tuple(array.shape), dtype_name(array))
    with _names_lock:
        seen = _layouts.setdefault(name, [])
        if layout not in seen:
            seen.append(layout)
        index = seen.index(layout)
    return name if index == 0 else f"{name}#{index}"


def _token(key: str) -> mx.nd.NDArray:
    """The array every op of ``key`` writes, so MXNet runs the ops of one name in the order issued."""
    with _names_lock:
        token = _tokens.get(key)
        if token is None:
            token = _tokens[key] = mx.nd.zeros((1,), ctx=mx.cpu())
    return token


def _check_scale(dtype: str, spec: OpSpec, what: str) -> None:
    if (spec.prescale != 1.0 or spec.postscale != 1.0) and not dtype.startswith("float"):
        raise ValueError(f"{what}: prescale_factor/postscale_factor need a floating-point array, got {dtype}")


def submit(tensor: mx.nd.NDArray, spec: OpSpec, inplace: bool, contribute: bool = True) -> mx.nd.NDArray:
    """Issue one op on MXNet's engine; returns its result array (``tensor`` itself if ``inplace``).

    ``contribute=False`` pushes zeros instead of ``tensor`` (the non-root
    ranks of a broadcast).
    """
    name = _resolve_name(spec.family, spec.name)
    what = f"{spec.family}({name!r})"
    check_array(tensor, what)
    _check_scale(dtype_name(tensor), spec, what)
    worker = api.worker()
    key = _key_name(name, tensor)
    worker.declare(key)  # ids follow the order ops are issued, not the order they become ready
    # Staging (unverified, see tensors.py): MXNet's engine orders the copies around the op.
    work = tensor if on_host(tensor) else tensor.copyto(mx.cpu())
    if inplace:
        if not contribute:
            zeros_like(work).copyto(work)
        elif spec.prescale != 1.0:
            work *= spec.prescale
        reads, result = [], work
    else:
        if not contribute:
            source = zeros_like(work)
        else:
            source = work * spec.prescale if spec.prescale != 1.0 else work
        reads, result = [source], empty_like(work)
    average = spec.average

    def start(arrays, dtype):
        output = arrays[1] if len(arrays) > 1 else None
        return worker.push_pull_async(arrays[0], key, average, output, dtype)

    _bridge.submit(reads, [result], _token(key), spec.priority, key, what, start)
    if spec.postscale != 1.0:
        result *= spec.postscale
    if work is tensor:
        return result
    if inplace:
        result.copyto(tensor)
        return tensor
    return result.as_in_context(tensor.context)


# --- BytePS names ----------------------------------------------------------------------


def byteps_push_pull(tensor: mx.nd.NDArray, version: int = 0, priority: int = 0, name: Optional[str] = None,
                     is_average: bool = True) -> None:
    """Sum (or average) ``tensor`` over all ranks, in place; returns at once, as in BytePS.

    ``version`` is accepted for BytePS compatibility and ignored; ``priority``
    orders ready ops on MXNet's engine.

    >>> bps.byteps_push_pull(x, name="x", is_average=False); x.wait_to_read()
    """
    submit(tensor, OpSpec("push_pull", name, bool(is_average), priority), inplace=True)


# --- Horovod names ---------------------------------------------------------------------


def allreduce(tensor: mx.nd.NDArray, average: Optional[bool] = None, name: Optional[str] = None, priority: int = 0,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0, op: Optional[int] = None) -> mx.nd.NDArray:
    """A new array: ``tensor`` averaged (default) or summed over all ranks.

    ``prescale_factor`` multiplies the input before the reduction,
    ``postscale_factor`` the result after it (floating-point arrays only).
    """
    spec = OpSpec("allreduce", name, average_of(op, average), priority, prescale_factor, postscale_factor)
    return submit(tensor, spec, inplace=False)


def allreduce_(tensor: mx.nd.NDArray, average: Optional[bool] = None, name: Optional[str] = None, priority: int = 0,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0, op: Optional[int] = None) -> mx.nd.NDArray:
    """:func:`allreduce` into ``tensor`` itself; returns it."""
    spec = OpSpec("allreduce", name, average_of(op, average), priority, prescale_factor, postscale_factor)
    return submit(tensor, spec, inplace=True)


def _check_root(root_rank: int) -> None:
    if isinstance(root_rank, bool) or not isinstance(root_rank, int) or not 0 <= root_rank < size():
        raise ValueError(f"broadcast: root_rank must be a rank in 0..{size() - 1}, got {root_rank!r}")


def _broadcast(tensor: mx.nd.NDArray, root_rank: int, name: Optional[str], priority: int,
               inplace: bool) -> mx.nd.NDArray:
    _check_root(root_rank)
    spec = OpSpec("broadcast", name, average=False, priority=priority)
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


def broadcast(tensor: mx.nd.NDArray, root_rank: int, name: Optional[str] = None, priority: int = 0) -> mx.nd.NDArray:
    """A new array holding the root's ``tensor`` on every rank (BytePS's way: the others push zeros)."""
    return _broadcast(tensor, root_rank, name, priority, inplace=False)


def broadcast_(tensor: mx.nd.NDArray, root_rank: int, name: Optional[str] = None, priority: int = 0) -> mx.nd.NDArray:
    """Overwrite ``tensor`` on every rank with the root's; returns it."""
    return _broadcast(tensor, root_rank, name, priority, inplace=True)
