"""push_pull, allreduce and broadcast of torch tensors, in BytePS's and Horovod's names.

Example (``bpslaunch -np 2 -- python train.py``)::

    import torch
    import byteps.torch as bps

    bps.init()
    x = torch.full((3,), float(bps.rank()))
    bps.push_pull(x, name="x")             # new tensor: the average over ranks
    h = bps.allreduce_async_(x, op=bps.Sum, name="x.sum")
    bps.synchronize(h)                     # x now holds the sum, in place

Rules every rank must follow, as in Horovod and BytePS:

* All ranks issue the same push_pulls, with the same names, shapes and dtypes,
  in the same order. The servers refuse a rank whose tensor differs from the
  others' under the same name, and every rank's push_pull then fails with an
  error naming both descriptions. A name may be used again later with
  another shape or dtype (it then maps to another byteps tensor, see
  ``_key_name``).
* A name may not be reused while an op of it is in flight (ValueError).
* ``name=None`` gives ``"<op>.noname.<n>"`` from a per-process counter per op
  (``allreduce``, ``push_pull``, ``broadcast``): the same on every rank only if
  all ranks issue their unnamed ops in the same order. Each such name is a new
  tensor to the servers, which keep per-name buffers for the whole job, so
  name anything done every step.

Averages divide by the number of worker processes; integer tensors use floor
division (``-3 // 2 == -2``), as byteps-common does. Broadcast works as in
BytePS: the root contributes its tensor, every other rank zeros, and the sum
is the root's tensor. Tensors on a GPU are staged through host copies
(see :mod:`byteps.torch.tensors`; unverified here, no GPU on the build machine).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from byteps.common import api
from byteps.torch.compression import Compression
from byteps.torch.handles import HandleTable, PendingOp, SpeedMeter
from byteps.torch.tensors import HostTensor, check_tensor, numpy_view, shares_memory

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "declare", "barrier",
    "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "push_pull", "push_pull_async", "push_pull_inplace", "push_pull_async_inplace", "poll", "synchronize",
    "handle_done_callback", "get_pushpull_speed", "join",
]

# Reduction ops with Horovod's values; byteps reduces by Average and Sum only.
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max", Product: "Product"}

_handles = HandleTable()
_speed = SpeedMeter()
_names_lock = threading.Lock()
_noname_counters: Dict[str, itertools.count] = {}
_layouts: Dict[str, List[Tuple[Tuple[int, ...], torch.dtype]]] = {}
_busy: Dict[str, object] = {}  # user name -> token of its op in flight


def init() -> None:
    """Join the job that ``bpslaunch`` describes in the environment. Idempotent."""
    api.init()


def shutdown() -> None:
    """Leave the job (also runs at exit); pending handles become invalid."""
    api.shutdown()
    _handles.clear()
    with _names_lock:
        _layouts.clear()
        _busy.clear()


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


def declare(name: str, tensor: Optional[torch.Tensor] = None, compression: Any = Compression.none) -> int:
    """Declare a tensor name ahead of its first push_pull (fixes its id); returns the id.

    With ``tensor`` (and the ``compression`` its push_pulls will use) the
    size it is sent with is declared too, so its partitions can go to the
    least loaded servers (BYTEPS_SERVER_ASSIGNMENT=balanced); every rank must
    then declare the same names and sizes in the same order, and the name's
    first push_pull must send that size. Without a tensor, or with a
    compressor whose output size byteps cannot know ahead, the partitions
    are placed by hashing their keys.
    """
    size = wire_size(tensor, compression) if tensor is not None else None
    if size is None:
        return api.declare(name)
    return api.declare(name, nbytes=size[0], itemsize=size[1])


def wire_size(tensor: torch.Tensor, compression: Any = Compression.none) -> Optional[Tuple[int, int]]:
    """(bytes, element size) a push_pull of ``tensor`` sends through ``compression``; None if unknown.

    Known for the built-in compressors only: a user's compressor may send
    any size (top-k, quantization), and a declared size the push_pull then
    does not match would be an error.
    """
    if compression is Compression.none or isinstance(compression, Compression.none):
        itemsize = tensor.element_size()
    elif compression is Compression.fp16 or isinstance(compression, Compression.fp16):
        itemsize = 2 if tensor.dtype.is_floating_point else tensor.element_size()
    else:
        return None
    return tensor.numel() * itemsize, itemsize


def barrier() -> None:
    """Block until every worker process has called barrier()."""
    api.barrier()


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """What to do with one tensor: which op family, name, averaging and scaling."""

    family: str
    name: Optional[str]
    average: bool
    prescale: float = 1.0
    postscale: float = 1.0

    def for_gradient(self) -> OpSpec:
        return dataclasses.replace(self, name=None if self.name is None else self.name + ".grad")


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
        f"op={_OP_NAMES.get(op, op)} is not supported by byteps, whose servers sum: use op=Average or op=Sum"
        + (" (Adasum needs its own reduction algorithm, which byteps does not have)" if op == Adasum else ""))


def _resolve_name(family: str, name: Optional[str]) -> str:
    if name is None:
        with _names_lock:
            counter = _noname_counters.setdefault(family, itertools.count())
            return f"{family}.noname.{next(counter)}"
    if not isinstance(name, str) or not name:
        raise ValueError(f"{family}: a name must be a non-empty string, got {name!r}")
    return name


def _key_name(name: str, tensor: torch.Tensor) -> str:
    """The byteps tensor name behind a user's name: one per (shape, dtype) the name is used with.

    byteps fixes a tensor name's size and dtype at first use; Horovod lets a
    name be reused for another shape (a smaller last batch, two models with
    the same parameter names). The first layout keeps the name, later ones
    become ``"<name>#<k>"`` in order of first use, the same on every rank
    that issues the same ops.
    """
    layout = (tuple(tensor.shape), tensor.dtype)
    with _names_lock:
        seen = _layouts.setdefault(name, [])
        if layout not in seen:
            seen.append(layout)
        index = seen.index(layout)
    return name if index == 0 else f"{name}#{index}"


def _reserve(name: str, what: str) -> object:
    """Mark ``name`` in flight; returns the token that releases it."""
    with _names_lock:
        if name in _busy:
            raise ValueError(f"{what}: an op of this name is still in flight; synchronize() its handle "
                             "before submitting the name again")
        token = _busy[name] = object()
    return token


def _release(name: str, token: object) -> None:
    """Free ``name`` unless a later op has it already (a late done-callback of an earlier one)."""
    with _names_lock:
        if _busy.get(name) is token:
            del _busy[name]


def _check_scale(tensor: torch.Tensor, spec: OpSpec, what: str) -> None:
    if (spec.prescale != 1.0 or spec.postscale != 1.0) and not tensor.dtype.is_floating_point:
        raise ValueError(f"{what}: prescale_factor/postscale_factor need a floating-point tensor, got {tensor.dtype}")


def submit(tensor: torch.Tensor, spec: OpSpec, inplace: bool, compression: Any = Compression.none,
            contribute: bool = True) -> int:
    """Start one reduction; returns its handle. ``contribute=False`` pushes zeros (broadcast)."""
    name = _resolve_name(spec.family, spec.name)
    what = f"{spec.family}({name!r})"
    check_tensor(tensor, what)
    _check_scale(tensor, spec, what)
    sent = tensor.detach()
    if spec.prescale != 1.0:
        sent = sent * spec.prescale
    sent, ctx = compression.compress(sent)
    host = HostTensor.of(sent, what)
    key = _key_name(name, host.host)
    token = _reserve(name, what)
    try:
        # Does byteps work on the caller's own memory? Then an out-of-place op needs an output.
        aliased = shares_memory(host.host, tensor)
        if not contribute:
            if aliased and not inplace:
                host = HostTensor.of(torch.zeros_like(host.host), what)
                aliased = False
            else:
                host.host.zero_()
        if aliased and not inplace:
            result = torch.empty_like(host.host)
            output = numpy_view(result, what)
        else:
            result, output = host.host, None
        start = time.time()
        core = api.worker().push_pull_async(host.array, key, spec.average, output, host.dtype)
    except BaseException:
        _release(name, token)
        raise
    nbytes = host.array.nbytes

    def finished(handle: Any) -> None:
        _release(name, token)
        if handle.error is None:
            _speed.record(start, nbytes)

    core.add_done_callback(finished)

    def finish() -> torch.Tensor:
        out = result.to(tensor.device) if host.staged else result
        out = compression.decompress(out, ctx)
        if spec.postscale != 1.0:
            out = out * spec.postscale
        if not inplace:
            return out
        if not shares_memory(out, tensor):
            with torch.no_grad():
                tensor.copy_(out)
        return tensor

    return _handles.add(PendingOp(core, finish, lambda: _release(name, token)))


def poll(handle: int) -> bool:
    """True once the push_pull behind ``handle`` has finished (synchronize() will not block)."""
    return _handles.get(handle).core.poll()


def synchronize(handle: int) -> torch.Tensor:
    """Wait for an asynchronous op and return its result tensor; the handle is then spent.

    Raises :class:`byteps.common.PushPullError` if the op failed, e.g. when the
    ranks' tensors of this name differ in shape or dtype.
    """
    op = _handles.get(handle)
    try:
        op.core.wait()
    finally:
        _handles.pop(handle)
        op.release()  # done-callbacks may still be running: free the name for the caller now
    return op.finish()


def handle_done_callback(handle: int, callback: Callable[[], None]) -> None:
    """Run ``callback()`` once the push_pull behind ``handle`` has finished.

    It runs on byteps' communication thread (or at once, on this thread, if
    already finished): keep it short and never wait on another push_pull in
    it. The handle still has to be synchronize()d, which then returns at once;
    calling synchronize() from the callback is allowed. The callback also runs
    when the op failed; synchronize() raises the error.
    """
    _handles.get(handle).core.add_done_callback(lambda _core: callback())


def get_pushpull_speed() -> Tuple[float, float]:
    """``(timestamp, MB/s)``: throughput of recently completed push_pulls, as in BytePS.

    Counts tensor bytes (not bytes on the wire) of every push_pull, allreduce
    and broadcast that ended within 10 s before the latest completion, over
    the time from the earliest start among them to that completion.
    ``timestamp`` is that latest completion (seconds since the epoch);
    ``(0.0, 0.0)`` before any push_pull has finished.
    """
    return _speed.speed()


# --- BytePS names -------------------------------------------------------------------


class ReduceFunction(torch.autograd.Function):
    """A push_pull whose gradient is the push_pull of the gradient, averaged the same way."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, spec: OpSpec) -> torch.Tensor:
        ctx.spec = spec
        return synchronize(submit(tensor, spec, inplace=False))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, None]:
        return synchronize(submit(grad.contiguous(), ctx.spec.for_gradient(), inplace=False)), None


def push_pull(tensor: torch.Tensor, average: bool = True, name: Optional[str] = None,
              compression: Any = Compression.none, op: Optional[int] = None, *,
              version: int = 0, priority: int = 0) -> torch.Tensor:
    """Average (or sum) ``tensor`` over all ranks into a new tensor; differentiable.

    ``op`` (Average/Sum), when given, supersedes ``average``. ``version`` and
    ``priority`` are accepted for BytePS source compatibility and ignored
    (byteps has no priority scheduling yet).

    >>> bps.push_pull(torch.ones(3), name="ones", average=False)   # tensor([2., 2., 2.]) with 2 ranks
    """
    spec = OpSpec("push_pull", name, average_of(op, None if op is not None else average))
    compressed, ctx = compression.compress(tensor)
    return compression.decompress(ReduceFunction.apply(compressed, spec), ctx)


def push_pull_async(tensor: torch.Tensor, average: bool = True, name: Optional[str] = None,
                    compression: Any = Compression.none, op: Optional[int] = None, *,
                    version: int = 0, priority: int = 0) -> int:
    """Start :func:`push_pull` without waiting (not differentiable); synchronize(handle) returns the result."""
    spec = OpSpec("push_pull", name, average_of(op, None if op is not None else average))
    return submit(tensor, spec, inplace=False, compression=compression)


def push_pull_inplace(tensor: torch.Tensor, average: bool = True, name: Optional[str] = None,
                      compression: Any = Compression.none, op: Optional[int] = None, *,
                      version: int = 0, priority: int = 0) -> torch.Tensor:
    """Like :func:`push_pull` but writes the result into ``tensor`` and returns it (not differentiable)."""
    return synchronize(push_pull_async_inplace(tensor, average, name, compression, op))


def push_pull_async_inplace(tensor: torch.Tensor, average: bool = True, name: Optional[str] = None,
                            compression: Any = Compression.none, op: Optional[int] = None, *,
                            version: int = 0, priority: int = 0) -> int:
    """Start an in-place push_pull; ``tensor`` must not be touched until synchronize(handle)."""
    spec = OpSpec("push_pull", name, average_of(op, None if op is not None else average))
    return submit(tensor, spec, inplace=True, compression=compression)


def join() -> int:
    """Wait until every rank has called join(); returns the rank whose call started last.

    Unlike Horovod, ranks that joined do not keep serving the others'
    allreduces with zeros: every rank must have issued the same ops before
    joining (uneven data per rank is not supported). "Last" compares the
    ranks' wall clocks (``time.time()``) at entry, so across machines it is
    only as good as their clock synchronisation.
    """
    entered = torch.zeros(size(), dtype=torch.float64)
    entered[rank()] = time.time()
    arrivals = synchronize(submit(entered, OpSpec("join", "byteps.join", average=False), inplace=True))
    return int(torch.argmax(arrivals).item())

