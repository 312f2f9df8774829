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

Averages divide by the number of worker processes; integer tensors are
summed and divided here, rounding towards zero (``-3 / 2 == -1``) as
Horovod's torch ops do (byteps-common itself floors). Broadcast works as in
BytePS: the root contributes its tensor, every other rank zeros, and the sum
is the root's tensor. CUDA tensors stay on their device: the front copies
them to pinned host memory and back partition by partition, on a stream of
its own ordered after the caller's (docs/gpu.md).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, List, Optional, Tuple

import torch

from byteps.common import api
from byteps.common.frontend.handle_table import OpTracker
from byteps.common.frontend.names import TensorNames
from byteps.common.frontend.process import after_shutdown
from byteps.common.frontend.reductions import OpSpec, average_of, divide_towards_zero
from byteps.torch.compression import Compression
from byteps.torch.tensors import HostTensor, byteps_dtype, check_tensor, numpy_view, scaled, shares_memory

__all__ = [
    "declare",
    "push_pull", "push_pull_async", "push_pull_inplace", "push_pull_async_inplace", "poll", "synchronize",
    "handle_done_callback", "get_pushpull_speed",
]

_names = TensorNames()
_tracker = OpTracker(_names)
_handles = _tracker.handles

after_shutdown(_tracker.forget)


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
    elif compression is Compression.bf16 or isinstance(compression, Compression.bf16):
        itemsize = 2 if tensor.dtype.is_floating_point and tensor.element_size() > 2 else tensor.element_size()
    else:
        return None
    return tensor.numel() * itemsize, itemsize


def _key_name(name: str, tensor: torch.Tensor, set_id: int = 0) -> str:
    """The byteps tensor name behind a user's name: one per (shape, dtype) it is used with (see the front)."""
    return _names.key(name, (tuple(tensor.shape), tensor.dtype), set_id)


def submit(tensor: torch.Tensor, spec: OpSpec, inplace: bool, compression: Any = Compression.none,
           contribute: bool = True, compression_spec: Any = None, lr: Optional[float] = None) -> int:
    """Start one reduction; returns its handle. ``contribute=False`` pushes zeros (broadcast).

    ``compression_spec`` (a parsed compression_params) compresses it on the way to the servers; ``lr`` is
    the optimizer's learning rate, which error feedback needs. A CUDA tensor stays on its device: the
    front stages it through pinned host memory partition by partition (docs/gpu.md).
    """
    name = _names.resolve(spec.family, spec.name)
    what = f"{spec.family}({name!r})"
    try:
        check_tensor(tensor, what)
        sent = scaled(tensor.detach(), spec.prescale)
        sent, ctx = compression.compress(sent)
        on_device = sent.device.type == "cuda"
        if on_device:
            dtype = byteps_dtype(sent.dtype, what)
        else:
            host = HostTensor.of(sent, what)
            sent, dtype = host.host, host.dtype
        token = _names.reserve(name, what)
    except BaseException:
        _names.free_slot(name, refused=True)  # a refused unnamed call leaves the next one the same name everywhere
        raise
    try:
        # with the name reserved: a switch of layout is announced after the name's last use
        key = _key_name(name, sent, spec.set_id)
        # Does byteps work on the caller's own memory? Then an out-of-place op needs an output.
        aliased = shares_memory(sent, tensor)
        if not contribute:
            if aliased and not inplace:
                sent = torch.zeros_like(sent)
                aliased = False
            else:
                sent.zero_()
        result = torch.empty_like(sent) if aliased and not inplace else sent
        # Horovod's integer average rounds towards zero: sum, then divide in finish().
        truncate = spec.average and not (sent.is_floating_point() or sent.dtype == torch.bool)
        average = spec.average and not truncate
        start = time.time()
        worker = api.worker()
        options = dataclasses.replace(spec, average=average).push_pull_options(
            dtype=dtype, compression=compression_spec, lr=lr)
        if on_device:
            core = worker.push_pull_async(_bytes(sent), key, options.replace(
                output=None if result is sent else _bytes(result),
                stream=torch.cuda.current_stream(sent.device).cuda_stream))
        else:
            core = worker.push_pull_async(numpy_view(sent, what), key, options.replace(
                output=None if result is sent else numpy_view(result, what)))
    except BaseException:
        _names.release(name, token)
        _names.free_slot(name, token, refused=True)
        raise

    def finish() -> torch.Tensor:
        out = result
        if truncate:
            count = len(spec.members) if spec.members is not None else api.size()
            if on_device:
                out.copy_(torch.div(out, count, rounding_mode="trunc"))
            else:
                divide_towards_zero(numpy_view(out, what), count)
        if out.device != tensor.device:
            out = out.to(tensor.device)  # a tensor staged by a host copy (a device other than CUDA)
        out = compression.decompress(out, ctx)
        out = scaled(out, spec.postscale)
        if not inplace:
            return out
        if not shares_memory(out, tensor):
            with torch.no_grad():
                tensor.copy_(out)
        return tensor

    return _tracker.track(core, name, token, start, sent.numel() * sent.element_size(), finish)


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CUDA tensor's bytes as a flat uint8 tensor (CuPy reads any dtype that way, bfloat16 too)."""
    return tensor.reshape(-1).view(torch.uint8)


def group_handles(handles: List[int]) -> int:
    """One handle for several ops' handles (spent); synchronize() returns their results as a list."""
    return _handles.group(handles)


def poll(handle: int) -> bool:
    """True once the push_pull behind ``handle`` has finished (synchronize() will not block)."""
    return _handles.poll(handle)


def synchronize(handle: int) -> torch.Tensor:
    """Wait for an asynchronous op and return its result tensor; the handle is then spent.

    Raises :class:`byteps.common.PushPullError` if the op failed, e.g. when the
    ranks' tensors of this name differ in shape or dtype.
    """
    return _handles.synchronize(handle)


def handle_done_callback(handle: int, callback: Callable[[], None]) -> None:
    """Run ``callback()`` once the push_pull behind ``handle`` has finished.

    It runs on byteps' communication thread (or at once, on this thread, if
    already finished): keep it short and never wait on another push_pull in
    it. The handle still has to be synchronize()d, which then returns at once;
    calling synchronize() from the callback is allowed. The callback also runs
    when the op failed; synchronize() raises the error.
    """
    _handles.add_done_callback(handle, callback)


def get_pushpull_speed() -> Tuple[float, float]:
    """``(timestamp, MB/s)``: throughput of recently completed push_pulls, as in BytePS.

    Counts tensor bytes (not bytes on the wire) of every push_pull, allreduce
    and broadcast that ended within 10 s before the latest completion, over
    the time from the earliest start among them to that completion.
    ``timestamp`` is that latest completion (seconds since the epoch);
    ``(0.0, 0.0)`` before any push_pull has finished.
    """
    return _tracker.speed.speed()


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
    ``priority`` are accepted for BytePS source compatibility and ignored:
    byteps orders partitions by when their tensors were first declared
    (docs/architecture.md).

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
                            version: int = 0, priority: int = 0, compression_spec: Any = None,
                            lr: Optional[float] = None) -> int:
    """Start an in-place push_pull; ``tensor`` must not be touched until synchronize(handle).

    ``compression_spec`` and ``lr``: BytePS's gradient compression (see DistributedOptimizer's
    ``compression_params``).
    """
    spec = OpSpec("push_pull", name, average_of(op, None if op is not None else average))
    return submit(tensor, spec, inplace=True, compression=compression, compression_spec=compression_spec, lr=lr)
