"""Horovod's names for byteps' reductions: allreduce and broadcast, async and in place.

They keep Horovod's signatures, so ``import byteps.torch as hvd`` runs a
Horovod script. See :mod:`byteps.torch.ops` for the rules all ranks follow
(same ops, names, shapes and order; default names; integer averages).

Broadcast is BytePS's: the root pushes its tensor and every other rank
pushes zeros, so the sum is the root's tensor. bool, uint8, int8 and int16
tensors, which byteps does not reduce, are broadcast through an int32 copy.

Example::

    hvd.allreduce(grad, op=hvd.Sum, name="grad")
    hvd.broadcast_(weights, root_rank=0, name="weights")
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from byteps.common.frontend import Average, average_of, check_root, rank, size
from byteps.torch.compression import Compression, Compressor
from byteps.torch.ops import OpSpec, ReduceFunction, submit, synchronize

__all__ = [
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
]


def allreduce(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
              compression: Any = Compression.none, op: Optional[int] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Average (default) or sum ``tensor`` over all ranks into a new tensor; differentiable.

    ``prescale_factor`` multiplies the input before the reduction,
    ``postscale_factor`` the result after it (floating-point tensors only).
    """
    spec = OpSpec("allreduce", name, average_of(op, average), prescale_factor, postscale_factor)
    compressed, ctx = compression.compress(tensor)
    return compression.decompress(ReduceFunction.apply(compressed, spec), ctx)


def allreduce_async(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
                    op: Optional[int] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> int:
    """Start :func:`allreduce`; ``synchronize(handle)`` returns the new tensor."""
    spec = OpSpec("allreduce", name, average_of(op, average), prescale_factor, postscale_factor)
    return submit(tensor, spec, inplace=False)


def allreduce_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
               op: Optional[int] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """:func:`allreduce` into ``tensor`` itself; returns it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor))


def allreduce_async_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
                     op: Optional[int] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> int:
    """Start an in-place :func:`allreduce`; leave ``tensor`` alone until ``synchronize(handle)``."""
    spec = OpSpec("allreduce", name, average_of(op, average), prescale_factor, postscale_factor)
    return submit(tensor, spec, inplace=True)


class _WidenNarrowIntegers(Compressor):
    """Sends bool/uint8/int8/int16 as int32 (exact: broadcast adds only zeros to the root's values)."""

    NARROW = (torch.bool, torch.uint8, torch.int8, torch.int16)

    @staticmethod
    def compress(tensor: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        if tensor.dtype in _WidenNarrowIntegers.NARROW:
            return tensor.to(torch.int32), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor if ctx is None else tensor.to(ctx)


def _check_root(root_rank: int) -> None:
    check_root(root_rank, size())


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None) -> int:
    """Start a broadcast of the root's ``tensor``; ``synchronize(handle)`` returns a new tensor."""
    _check_root(root_rank)
    return submit(tensor, OpSpec("broadcast", name, average=False), inplace=False,
                  compression=_WidenNarrowIntegers, contribute=rank() == root_rank)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None) -> int:
    """Start a broadcast into ``tensor`` itself on every rank."""
    _check_root(root_rank)
    return submit(tensor, OpSpec("broadcast", name, average=False), inplace=True,
                  compression=_WidenNarrowIntegers, contribute=rank() == root_rank)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None) -> torch.Tensor:
    """Overwrite ``tensor`` on every rank with the root's; returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name))


class _BroadcastFunction(torch.autograd.Function):
    """Horovod's gradient of a broadcast: the averaged gradient at the root, zeros elsewhere."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: Optional[str]) -> torch.Tensor:
        ctx.root_rank, ctx.name = root_rank, name
        return synchronize(broadcast_async(tensor, root_rank, name))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, None, None]:
        spec = OpSpec("allreduce", None if ctx.name is None else ctx.name + ".grad", average_of(Average, None))
        reduced = synchronize(submit(grad.contiguous(), spec, inplace=False))
        if rank() != ctx.root_rank:
            reduced = torch.zeros_like(reduced)
        return reduced, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None) -> torch.Tensor:
    """A new tensor holding the root's ``tensor`` on every rank; differentiable."""
    return _BroadcastFunction.apply(tensor, root_rank, name)
