"""Torch sparse gradients through byteps' row-sparse push_pull (docs/sparse.md).

A gradient of ``nn.Embedding(sparse=True)`` or ``nn.EmbeddingBag(sparse=True)``
is a sparse COO tensor with one sparse dimension: its indices' row 0 holds
row ids of the table, its values one row per id. Coalesced, that is the
(ids, rows) pair a row-sparse push_pull takes
(:meth:`byteps.common.worker.Worker.sparse_push_pull_async`); what comes back,
the union of every worker's ids with their rows summed (or averaged), is
turned into a coalesced sparse COO tensor of the gradient's shape, equal to
Horovod's sparse allreduce of the same gradients (which gathers every rank's
indices and values), so an optimizer steps alike on either.

:func:`takes_row_sparse` says whether a tensor goes this way: the job must
allow it (servers, any number of worker processes per machine, op Average
or Sum, every rank, no backup workers, synchronous training) and the tensor
must fit it (one sparse dimension, float16/32/64 or bfloat16 values).
Everything else keeps the gather path of :func:`byteps.torch.collectives.sparse_allreduce_async`.
Every condition is the same on every rank for the same parameter, so all
ranks take the same path. Example::

    grad = embedding.weight.grad                       # sparse, e.g. 1000 x 16
    if takes_row_sparse(grad, Average, None):
        started = start(grad, "Gradient.embedding.weight", average=True)
        averaged = started.finish()                    # waits; a coalesced sparse tensor of grad's shape
"""

from __future__ import annotations

from typing import Any, Tuple

import numpy as np
import torch

from byteps.common import api
from byteps.common.frontend import collectives as front
from byteps.common.frontend.row_sparse import job_takes_row_sparse
from byteps.common.frontend.row_sparse import table_name as front_table_name
from byteps.common.row_sparse import SparseRows
from byteps.torch.tensors import from_storage, numpy_view

__all__ = ["ROW_SPARSE_DTYPES", "nbytes", "no_rows", "sparse_parameters", "start", "table_name", "takes_row_sparse"]

#: Value dtypes the row-sparse push_pull takes (byteps.common.row_sparse.SPARSE_DTYPES); bfloat16 travels in
#: 16-bit storage (numpy has no bfloat16).
ROW_SPARSE_DTYPES = (torch.float16, torch.float32, torch.float64, torch.bfloat16)


def takes_row_sparse(tensor: torch.Tensor, op: Any, process_set: Any) -> bool:
    """Whether the sparse ``tensor`` is reduced by a row-sparse push_pull rather than gathered."""
    return (job_takes_row_sparse(op, process_set) and tensor.is_sparse and tensor.sparse_dim() == 1
            and tensor.dtype in ROW_SPARSE_DTYPES and all(size > 0 for size in tensor.shape))


def no_rows(p: torch.Tensor, sparse_dim: int) -> torch.Tensor:
    """A sparse gradient of ``p`` with ``sparse_dim`` sparse dimensions and no entries: what a rank whose
    sparse parameter got no gradient this step sends, as the others send theirs."""
    indices = torch.zeros((sparse_dim, 0), dtype=torch.int64, device=p.device)
    values = torch.zeros((0, *p.shape[sparse_dim:]), dtype=p.dtype, device=p.device)
    return torch.sparse_coo_tensor(indices, values, p.shape, check_invariants=False)


def sparse_parameters(module: torch.nn.Module) -> set:
    """The parameters of ``module`` whose gradients are sparse: the weights of its ``nn.Embedding`` and
    ``nn.EmbeddingBag`` layers built with ``sparse=True`` (the same on every rank that builds the same model)."""
    return {layer.weight for layer in module.modules()
            if isinstance(layer, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and layer.sparse}


def table_name(name: str, tensor: torch.Tensor) -> str:
    """The table of a user's ``name`` used with ``tensor``'s layout: one table per (name, shape, dtype), as
    the dense adapters give each layout of a name a tensor of its own, so a name (a default one above all)
    may come back with another shape."""
    return front_table_name(name, tensor.shape, str(tensor.dtype).replace("torch.", ""))


def start(tensor: torch.Tensor, table: str, average: bool) -> front.Started:
    """Start the row-sparse push_pull of the sparse ``tensor`` as ``table``; the returned
    :class:`~byteps.common.frontend.collectives.Started`'s ``finish()`` gives the coalesced sparse result."""
    ids, rows = _ids_and_rows(tensor)
    shape, device = tensor.shape, tensor.device
    bfloat16 = "bfloat16" if tensor.dtype == torch.bfloat16 else None
    handle = api.worker().sparse_push_pull_async(ids, rows, table, shape[0], tuple(shape[1:]), average, bfloat16)
    return front.Started(handle, lambda: _sparse_tensor(handle.wait(), shape, tensor.dtype, device))


def nbytes(tensor: torch.Tensor) -> int:
    """Bytes this rank pushes for the sparse ``tensor`` (ids and rows, before duplicates are summed)."""
    return tensor._nnz() * (8 + tensor.dtype.itemsize * int(np.prod(tensor.shape[1:], dtype=np.int64)))


def _ids_and_rows(tensor: torch.Tensor) -> Tuple[np.ndarray, np.ndarray]:
    coalesced = tensor.detach().coalesce()   # duplicates summed in torch, ids ascending
    ids = coalesced.indices()[0].to("cpu").numpy()
    return ids, numpy_view(coalesced.values().to("cpu").contiguous(), "sparse gradient")  # bfloat16: uint16


def _sparse_tensor(result: SparseRows, shape: torch.Size, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    ids, rows = result
    # The merged answer may be a read-only view of a received message: torch wants memory of its own.
    rows = rows if rows.flags.writeable else rows.copy()
    ids = ids if ids.flags.writeable else ids.copy()
    values = from_storage(rows, dtype)
    indices = torch.from_numpy(ids).reshape(1, -1)
    result_tensor = torch.sparse_coo_tensor(indices, values, shape, check_invariants=False, is_coalesced=True)
    return result_tensor.to(device)
