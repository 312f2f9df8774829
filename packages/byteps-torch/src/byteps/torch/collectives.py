"""Horovod's collectives beyond allreduce and broadcast, for torch tensors: allgather, alltoall, reducescatter.

Each is computed by :mod:`byteps.common.frontend.collectives` on the
tensor's bytes; this module turns tensors into those bytes and back, gives
each op a handle (``synchronize(handle)`` returns what the synchronous form
returns) and defines the gradients Horovod defines:

* allgather: the gradient is the average of the output's gradient over the
  ranks, of which each rank keeps its own rows;
* alltoall: the gradient goes back the way the rows came (an alltoall with
  the received splits);
* reducescatter: the gradient is the allgather of the output's gradient
  (times the number of ranks for ``op=Sum``, and the scale factors).

Allreduce with ``op=Min``, ``Max`` or ``Product`` is computed here too, from
every rank's tensor. Example::

    rows = hvd.allgather(torch.full((hvd.rank() + 1, 2), hvd.rank()))   # 1 + 2 + ... rows
    mine = hvd.reducescatter(torch.ones(4, 3), op=hvd.Sum)               # 4 / size() rows of size()
    largest = hvd.allreduce(loss, op=hvd.Max)
"""

from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from byteps.common.frontend import collectives as front
from byteps.common.frontend.checks import check_scale
from byteps.common.frontend.objects import allgather_object as _allgather_object
from byteps.common.frontend.process_sets import rank_view
from byteps.common.frontend.reductions import Average, Sum, op_name
from byteps.common.handle import all_done
from byteps.torch import row_sparse
from byteps.torch.ops import _names, _tracker, synchronize
from byteps.torch.tensors import byteps_dtype, check_tensor, from_storage, numpy_view
from byteps.torch.tensors import scaled as _scaled

__all__ = [
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
    "alltoall", "alltoall_async",
    "reducescatter", "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async",
    "reduce_by_gather_async", "allgather_object", "sparse_allreduce_async",
]


def _piece(tensor: torch.Tensor, what: str) -> front.Piece:
    """The tensor's bytes on the host (a contiguous copy when needed)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(tensor).__name__}")
    host = tensor.detach().to("cpu").contiguous()
    raw = host.reshape(-1).view(torch.uint8).numpy() if host.numel() else np.empty(0, np.uint8)
    return front.Piece(raw, tuple(host.shape), str(host.dtype))


def _tensor(piece: front.Piece, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A new tensor of ``dtype`` on ``device`` from a result piece's bytes, which are the caller's alone
    (:class:`~byteps.common.frontend.collectives.Piece`): on the host, a view of them when they are aligned
    for ``dtype`` (an allgather's 100 MB then costs no copy), else a copy."""
    if not piece.data.nbytes:
        return torch.empty(piece.shape, dtype=dtype, device=device)
    data = piece.data
    if not data.flags.writeable or data.ctypes.data % dtype.itemsize:
        data = np.array(data, dtype=np.uint8, copy=True)
    flat = torch.from_numpy(data).view(dtype)
    return flat.reshape(piece.shape).to(device)


def _start(family: str, name: Optional[str], nbytes: int, steps: Callable[[str], Any],
           finish: Callable[[Any], Any]) -> int:
    """Start ``steps(name)`` (one front :class:`~byteps.common.frontend.collectives.Started`, or a list of
    them); synchronize() returns ``finish(result)`` (a list of results for a list)."""
    resolved = _names.resolve(family, name)
    try:
        token = _names.reserve(resolved, f"{family}({resolved!r})")
    except BaseException:
        _names.free_slot(resolved, refused=True)
        raise
    try:
        started = steps(resolved)
    except BaseException:
        _names.release(resolved, token)
        _names.free_slot(resolved, token, refused=True)
        raise
    if isinstance(started, list):
        core = all_done([item.core for item in started])
        return _tracker.track(core, resolved, token, time.time(), nbytes,
                              lambda: finish([item.finish() for item in started]))
    return _tracker.track(started.core, resolved, token, time.time(), nbytes, lambda: finish(started.finish()))


# --- allgather --------------------------------------------------------------------------


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                            process_set: Any = None) -> int:
    """Start allgathers of ``tensors``; ``synchronize(handle)`` returns the gathered tensors, in order."""
    view = _view(process_set)
    pieces = [_piece(t, "allgather") for t in tensors]
    kinds = [(t.dtype, t.device) for t in tensors]

    def steps(resolved: str) -> List[front.Started]:
        return [front.allgather(f"{resolved}.{i}" if len(pieces) > 1 else resolved, p, view)
                for i, p in enumerate(pieces)]

    def finish(gathered: List[front.Piece]) -> List[torch.Tensor]:
        return [_tensor(p, dtype, device) for p, (dtype, device) in zip(gathered, kinds)]

    return _start("allgather", name, sum(p.data.nbytes for p in pieces), steps, finish)


def allgather_async(tensor: torch.Tensor, name: Optional[str] = None, process_set: Any = None) -> int:
    """Start an allgather; ``synchronize(handle)`` returns the ranks' tensors concatenated along dimension 0."""
    view = _view(process_set)
    piece = _piece(tensor, "allgather")
    dtype, device = tensor.dtype, tensor.device
    return _start("allgather", name, piece.data.nbytes,
                  lambda resolved: front.allgather(resolved, piece, view),
                  lambda gathered: _tensor(gathered, dtype, device))


def _own_rows(dims: Sequence[int], process_set: Any) -> List[int]:
    """This rank's first row in a gather of tensors with ``dims`` first dimensions (one gather per tensor)."""
    view = _view(process_set)
    counts = grouped_allgather([torch.tensor([d], dtype=torch.int64) for d in dims], process_set=process_set)
    return [int(c[:view.position].sum()) for c in counts]


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: Optional[str], process_set: Any) -> torch.Tensor:
        ctx.rows, ctx.process_set = tensor.shape[0], process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, None, None]:
        from byteps.torch.horovod_ops import allreduce
        reduced = allreduce(grad.contiguous(), op=Average, process_set=ctx.process_set)
        (first,) = _own_rows([ctx.rows], ctx.process_set)
        return reduced.narrow(0, first, ctx.rows), None, None


def allgather(tensor: torch.Tensor, name: Optional[str] = None, process_set: Any = None) -> torch.Tensor:
    """The ranks' tensors concatenated along dimension 0 (whose length may differ by rank); differentiable."""
    return _Allgather.apply(tensor, name, process_set)


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: Optional[str], process_set: Any, *tensors: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        ctx.rows, ctx.process_set = [t.shape[0] for t in tensors], process_set
        return tuple(synchronize(grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        from byteps.torch.horovod_ops import allreduce
        reduced = [allreduce(g.contiguous(), op=Average, process_set=ctx.process_set) for g in grads]
        firsts = _own_rows(ctx.rows, ctx.process_set)
        return (None, None, *(r.narrow(0, f, n) for r, f, n in zip(reduced, firsts, ctx.rows)))


def grouped_allgather(tensors: Sequence[torch.Tensor], name: Optional[str] = None,
                      process_set: Any = None) -> List[torch.Tensor]:
    """:func:`allgather` of each tensor; differentiable."""
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


# --- alltoall ---------------------------------------------------------------------------


def _splits(splits: Any) -> Optional[List[int]]:
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        if splits.dtype.is_floating_point or splits.dim() != 1:
            raise ValueError(f"alltoall: splits must be a 1-D integer tensor, got {splits.dtype} of shape "
                             f"{list(splits.shape)}")
        return [int(s) for s in splits.tolist()]
    return [int(s) for s in splits]


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: Optional[str] = None,
                   process_set: Any = None) -> int:
    """Start an alltoall; ``synchronize(handle)`` returns ``(received tensor, received splits)``."""
    view = _view(process_set)
    wanted = _splits(splits)
    piece = _piece(tensor, "alltoall")
    dtype, device = tensor.dtype, tensor.device

    def finish(result: Tuple[front.Piece, List[int]]) -> Tuple[torch.Tensor, torch.Tensor]:
        received, counts = result
        return _tensor(received, dtype, device), torch.tensor(counts, dtype=torch.int32)

    if not piece.shape:
        raise ValueError("alltoall: a scalar (0-d) tensor cannot be split; give it a first dimension")
    if wanted is None and piece.shape[0] % view.size:
        raise ValueError(f"alltoall: the first dimension ({piece.shape[0]}) does not divide evenly by the "
                         f"number of ranks ({view.size}); pass splits")
    if wanted is not None and (len(wanted) != view.size or sum(wanted) != piece.shape[0] or min(wanted) < 0):
        raise ValueError(f"alltoall: splits {wanted} must have one non-negative entry per rank ({view.size}) "
                         f"adding up to the first dimension ({piece.shape[0]})")
    return _start("alltoall", name, piece.data.nbytes,
                  lambda resolved: front.alltoall(resolved, piece, wanted, view), finish)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any, name: Optional[str], process_set: Any) -> Any:
        output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.received, ctx.process_set = received, process_set
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *_ignored: Any) -> Tuple[torch.Tensor, None, None, None]:
        back, _ = synchronize(alltoall_async(grad.contiguous(), ctx.received, process_set=ctx.process_set))
        return back, None, None, None


def alltoall(tensor: torch.Tensor, splits: Any = None, name: Optional[str] = None, process_set: Any = None) -> Any:
    """Scatter ``splits[j]`` rows to rank j and gather what the ranks sent here; differentiable.

    Returns the received tensor, and with ``splits`` also the received
    splits (rows from each rank, an int32 tensor), as Horovod does.
    """
    output, received = _Alltoall.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received)


# --- reducescatter ----------------------------------------------------------------------


def _reduce_op(op: Any) -> bool:
    """True to average, False to sum (Horovod's reducescatter takes Average or Sum)."""
    if op not in (Average, Sum):
        raise NotImplementedError(f"reducescatter: op must be Average or Sum, got {op_name(op)}")
    return op == Average


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: Optional[str] = None, op: Any = Average,
                                process_set: Any = None, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> int:
    """Start reducescatters of ``tensors``; ``synchronize(handle)`` returns this rank's rows of each."""
    view = _view(process_set)
    average = _reduce_op(op)
    staged = []
    for tensor in tensors:
        check_tensor(tensor, "reducescatter")
        if tensor.dim() == 0:
            raise ValueError("reducescatter: a scalar (0-d) tensor cannot be scattered; give it a first dimension")
        check_scale(1.0, 1.0, True, "reducescatter", tensor.dtype)
        host = _scaled(tensor.detach(), prescale_factor).to("cpu").contiguous()
        staged.append((host, numpy_view(host, "reducescatter"), byteps_dtype(host.dtype, "reducescatter")))

    def steps(resolved: str) -> List[front.Started]:
        # One byteps tensor per (name, shape, dtype), as for allreduce (see byteps.torch.ops).
        return [front.reducescatter(_names.key(f"{resolved}.{i}" if len(staged) > 1 else resolved,
                                               (tuple(array.shape), dtype), view.set_id), array, dtype, average,
                                     view)
                for i, (_, array, dtype) in enumerate(staged)]

    def finish(parts: List[np.ndarray]) -> List[torch.Tensor]:
        out = []
        for part, tensor, (host, _, _) in zip(parts, tensors, staged):
            out.append(_scaled(from_storage(part, host.dtype), postscale_factor).to(tensor.device))
        return out

    return _start("reducescatter", name, sum(h.numel() * h.element_size() for h, _, _ in staged), steps, finish)


def reducescatter_async(tensor: torch.Tensor, name: Optional[str] = None, op: Any = Average, process_set: Any = None,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> int:
    """Start a reducescatter; ``synchronize(handle)`` returns this rank's rows of the reduced tensor."""
    handle = grouped_reducescatter_async([tensor], name, op, process_set, prescale_factor, postscale_factor)
    return _tracker.handles.then(handle, lambda parts: parts[0])


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: Optional[str], op: Any, process_set: Any, prescale: float, postscale: float,
                *tensors: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        ctx.op, ctx.process_set, ctx.scale = op, process_set, prescale * postscale
        return tuple(synchronize(grouped_reducescatter_async(list(tensors), name, op, process_set,
                                                             prescale, postscale)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        factor = ctx.scale * (_view(ctx.process_set).size if ctx.op == Sum else 1)
        scaled = [g * factor if factor != 1 else g for g in grads]
        return (None, None, None, None, None, *grouped_allgather(scaled, process_set=ctx.process_set))


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: Optional[str] = None, compression: Any = None,
                          op: Any = Average, process_set: Any = None, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> List[torch.Tensor]:
    """Reduce each tensor over the ranks and keep this rank's rows of each; differentiable."""
    return list(_Reducescatter.apply(name, op, process_set, prescale_factor, postscale_factor, *tensors))


def reducescatter(tensor: torch.Tensor, name: Optional[str] = None, compression: Any = None, op: Any = Average,
                  process_set: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce ``tensor`` over the ranks and keep this rank's rows (the first ``rows % size`` ranks get one more)."""
    return grouped_reducescatter([tensor], name, compression, op, process_set, prescale_factor, postscale_factor)[0]


# --- allreduce by Min, Max, Product; objects --------------------------------------------


def reduce_by_gather_async(tensor: torch.Tensor, op: int, name: Optional[str], inplace: bool,
                           prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                           process_set: Any = None) -> int:
    """Start an allreduce by Min, Max, Product or Adasum (computed from every rank's tensor)."""
    view = _view(process_set)
    check_tensor(tensor, f"allreduce(op={op_name(op)})")
    host = _scaled(tensor.detach(), prescale_factor).to("cpu").contiguous()
    compute = host.float() if host.dtype in (torch.float16, torch.bfloat16) else host
    numpy_dtype = compute.numpy().dtype if compute.dtype != torch.bool else np.dtype(np.bool_)
    piece = _piece(compute, "allreduce")

    def finish(result: np.ndarray) -> torch.Tensor:
        out = _scaled(torch.from_numpy(result).to(host.dtype), postscale_factor).to(tensor.device)
        if not inplace:
            return out
        with torch.no_grad():
            tensor.copy_(out)
        return tensor

    return _start("allreduce", name, piece.data.nbytes,
                  lambda resolved: front.reduce_by_gather(resolved, piece, op, numpy_dtype, view), finish)


def sparse_allreduce_async(tensor: torch.Tensor, name: Optional[str] = None, op: Any = Average,
                           process_set: Any = None) -> int:
    """Start Horovod's sparse allreduce of a sparse COO tensor; ``synchronize(handle)`` (or ``handle()``, as
    in Horovod) returns the sparse sum (or average, for ``op=Average``).

    Two paths, with equal results (docs/sparse.md). Where the job allows it
    (servers, every rank, no backup workers, synchronous training) and the
    tensor fits it (one sparse dimension, as an embedding's gradient has;
    float16, float32, float64 or bfloat16 values), a row-sparse push_pull:
    each rank's rows summed by id on the servers, and the result a coalesced
    tensor over the union of the ranks' rows. Otherwise (one machine without
    servers, a process set, several sparse dimensions) Horovod's way: every
    rank's indices and values gathered, the result uncoalesced as Horovod
    returns it::

        grad = torch.sparse_coo_tensor([[3, 7, 3]], torch.ones(3, 16), (1000, 16))
        averaged = bps.sparse_allreduce_async(grad, name="emb")()   # rows 3 and 7 of every rank, averaged
    """
    return _sparse_allreduce_async(tensor, name, op, process_set, None)


def _sparse_allreduce_async(tensor: torch.Tensor, name: Optional[str], op: Any, process_set: Any,
                            table: Optional[str]) -> int:
    """:func:`sparse_allreduce_async`; ``table``: the row-sparse table's name (default: ``name`` and the
    tensor's layout, :func:`byteps.torch.row_sparse.table_name`)."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async: expected a sparse COO tensor (tensor.to_sparse())")
    if op not in (Average, Sum):
        raise NotImplementedError(f"sparse_allreduce_async: op must be Average or Sum, got {op_name(op)}")
    if row_sparse.takes_row_sparse(tensor, op, process_set):
        return _CallableHandle(_start(
            "sparse_allreduce", name, row_sparse.nbytes(tensor),
            lambda resolved: row_sparse.start(tensor, table or row_sparse.table_name(resolved, tensor), op == Average),
            lambda result: result))
    view = _view(process_set)
    sparse = tensor.coalesce() if not tensor.is_coalesced() else tensor
    indices = _piece(sparse.indices().transpose(0, 1).contiguous(), "sparse_allreduce")
    values = _piece(sparse.values().contiguous(), "sparse_allreduce")
    shape, device, value_dtype = tensor.shape, tensor.device, tensor.dtype

    def steps(resolved: str) -> List[front.Started]:
        return [front.allgather(f"{resolved}.indices", indices, view),
                front.allgather(f"{resolved}.values", values, view)]

    def finish(gathered: List[front.Piece]) -> torch.Tensor:
        where = _tensor(gathered[0], torch.int64, device)
        what = _tensor(gathered[1], value_dtype, device)
        if op == Average:
            what = what / view.size
        return torch.sparse_coo_tensor(where.transpose(0, 1), what, shape, check_invariants=True)

    return _CallableHandle(_start("sparse_allreduce", name, indices.data.nbytes + values.data.nbytes, steps, finish))


class _CallableHandle(int):
    """A handle that synchronize() takes, and that returns its result when called (Horovod's sparse handle)."""

    def __call__(self) -> Any:
        return synchronize(self)


def allgather_object(obj: Any, name: Optional[str] = None, process_set: Any = None) -> List[Any]:
    """Every rank's picklable ``obj``, in rank order (byteps-common's front)."""
    return _allgather_object(obj, name, process_set)


def _view(process_set: Any) -> front.RankView:
    return rank_view(process_set)
