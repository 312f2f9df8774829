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

from typing import Any, List, Optional, Sequence, Tuple

import torch

from byteps.common.frontend import Average, rank
from byteps.common.frontend.process_sets import broadcast_spec, global_process_set, reduction_spec
from byteps.common.frontend.reductions import BY_GATHER
from byteps.torch.collectives import reduce_by_gather_async
from byteps.torch.compression import Compression, Compressor
from byteps.torch.ops import ReduceFunction, _names, group_handles, submit, synchronize

__all__ = [
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
]


def allreduce(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
              compression: Any = Compression.none, op: Optional[int] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: Any = global_process_set) -> torch.Tensor:
    """Average (default) or sum ``tensor`` over all ranks (or ``process_set``'s) into a new tensor; differentiable.

    ``op`` may also be Min, Max, Product or Adasum (not differentiable).
    ``prescale_factor`` multiplies the input before the reduction,
    ``postscale_factor`` the result after it (integers in float64, as Horovod).
    """
    if op in BY_GATHER:
        return synchronize(allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor, process_set))
    spec = reduction_spec("allreduce", name, op, average, prescale_factor, postscale_factor, process_set)
    compressed, ctx = compression.compress(tensor)
    return compression.decompress(ReduceFunction.apply(compressed, spec), ctx)


def allreduce_async(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
                    op: Optional[int] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: Any = global_process_set) -> int:
    """Start :func:`allreduce`; ``synchronize(handle)`` returns the new tensor."""
    return _start(tensor, average, name, op, prescale_factor, postscale_factor, process_set, inplace=False)


def _start(tensor: torch.Tensor, average: Optional[bool], name: Optional[str], op: Optional[int], prescale: float,
           postscale: float, process_set: Any, inplace: bool) -> int:
    if op in BY_GATHER:
        if average is not None:
            raise ValueError("the op parameter supersedes average: pass only one of them")
        return reduce_by_gather_async(tensor, op, name, inplace, prescale, postscale, process_set)
    spec = reduction_spec("allreduce", name, op, average, prescale, postscale, process_set)
    return submit(tensor, spec, inplace=inplace)


def allreduce_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
               op: Optional[int] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: Any = global_process_set) -> torch.Tensor:
    """:func:`allreduce` into ``tensor`` itself; returns it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


def allreduce_async_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
                     op: Optional[int] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: Any = global_process_set) -> int:
    """Start an in-place :func:`allreduce`; leave ``tensor`` alone until ``synchronize(handle)``."""
    return _start(tensor, average, name, op, prescale_factor, postscale_factor, process_set, inplace=True)


def _group_names(name: Optional[str], count: int) -> List[Optional[str]]:
    if name is None:
        base = _names.default("grouped_allreduce")
        return [f"{base}.{i}" for i in range(count)]
    return [f"{name}.{i}" for i in range(count)]


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                            name: Optional[str] = None, op: Optional[int] = None, prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0, process_set: Any = global_process_set) -> int:
    """Start allreduces of ``tensors`` as one group; ``synchronize(handle)`` returns the new tensors."""
    handles = [allreduce_async(t, average, n, op, prescale_factor, postscale_factor, process_set)
               for t, n in zip(tensors, _group_names(name, len(tensors)))]
    return group_handles(handles)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None,
                             name: Optional[str] = None, op: Optional[int] = None, prescale_factor: float = 1.0,
                             postscale_factor: float = 1.0, process_set: Any = global_process_set) -> int:
    """Start in-place allreduces of ``tensors``; ``synchronize(handle)`` returns them."""
    handles = [allreduce_async_(t, average, n, op, prescale_factor, postscale_factor, process_set)
               for t, n in zip(tensors, _group_names(name, len(tensors)))]
    return group_handles(handles)


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: Optional[bool] = None, name: Optional[str] = None,
                       op: Optional[int] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: Any = global_process_set) -> List[torch.Tensor]:
    """:func:`grouped_allreduce` into the tensors themselves; returns them."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                process_set))


class _GroupedReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, spec: Tuple, *tensors: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        ctx.spec = spec
        return tuple(synchronize(grouped_allreduce_async(list(tensors), *spec)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        average, name, op, prescale, postscale, process_set = ctx.spec
        grad_name = None if name is None else name + ".grad"
        reduced = synchronize(grouped_allreduce_async([g.contiguous() for g in grads], average, grad_name, op,
                                                      prescale, postscale, process_set))
        return (None, *reduced)


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: Optional[bool] = None, name: Optional[str] = None,
                      compression: Any = Compression.none, op: Optional[int] = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set: Any = global_process_set) -> List[torch.Tensor]:
    """:func:`allreduce` of each tensor, as one group; differentiable (by Average and Sum)."""
    compressed = [compression.compress(t) for t in tensors]
    spec = (average, name, op, prescale_factor, postscale_factor, process_set)
    reduced = _GroupedReduce.apply(spec, *(t for t, _ in compressed))
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, compressed)]


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


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                    process_set: Any = global_process_set) -> int:
    """Start a broadcast of the root's ``tensor``; ``synchronize(handle)`` returns a new tensor."""
    spec = broadcast_spec(root_rank, name, process_set)
    return submit(tensor, spec, inplace=False, compression=_WidenNarrowIntegers, contribute=rank() == root_rank)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
                     process_set: Any = global_process_set) -> int:
    """Start a broadcast into ``tensor`` itself on every rank."""
    spec = broadcast_spec(root_rank, name, process_set)
    return submit(tensor, spec, inplace=True, compression=_WidenNarrowIntegers, contribute=rank() == root_rank)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
               process_set: Any = global_process_set) -> torch.Tensor:
    """Overwrite ``tensor`` on every rank with the root's; returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class _BroadcastFunction(torch.autograd.Function):
    """Horovod's gradient of a broadcast: the averaged gradient at the root, zeros elsewhere."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: Optional[str],
                process_set: Any) -> torch.Tensor:
        ctx.root_rank, ctx.name, ctx.process_set = root_rank, name, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, None, None, None]:
        grad_name = None if ctx.name is None else ctx.name + ".grad"
        spec = reduction_spec("allreduce", grad_name, Average, None, 1.0, 1.0, ctx.process_set)
        reduced = synchronize(submit(grad.contiguous(), spec, inplace=False))
        if rank() != ctx.root_rank:
            reduced = torch.zeros_like(reduced)
        return reduced, None, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
              process_set: Any = global_process_set) -> torch.Tensor:
    """A new tensor holding the root's ``tensor`` on every rank (of ``process_set``); differentiable."""
    return _BroadcastFunction.apply(tensor, root_rank, name, process_set)
