"""MXNet ``row_sparse`` gradients through byteps' row-sparse push_pull (docs/sparse.md).

``gluon.nn.Embedding(..., sparse_grad=True)`` gives its weight a
``RowSparseNDArray`` gradient: ``indices`` (the rows a batch touched,
ascending and unique) and ``data`` (one row each). That is the (ids, rows)
pair a row-sparse push_pull takes
(:meth:`byteps.common.worker.Worker.sparse_push_pull_async`); what comes
back, the union of every worker's ids with their rows averaged, is written
into the gradient as a ``RowSparseNDArray`` of the same shape, which
MXNet's optimizers apply lazily (only the rows present), as MXNet's own
``dist_sync`` KVStore hands a gluon Trainer its summed row_sparse gradients.

:func:`takes_row_sparse` says whether a gradient goes this way: the job
must allow it (servers, op Average or Sum over every rank, no backup
workers, synchronous training; :func:`byteps.common.frontend.row_sparse.job_takes_row_sparse`)
and the gradient must fit it (``row_sparse``, float16/32/64). Otherwise the
trainer sends it dense (``tostype('default')``) and writes the average
back as ``row_sparse``: every rank takes the same path, since every
condition is the same on every rank. Example::

    grad = embedding.weight.list_grad()[0]            # row_sparse, e.g. 1000 x 16
    if takes_row_sparse(grad, Average, None):
        started = start(grad, "Gradient.embedding0_weight", average=True)
        started.finish().copyto(grad)                   # waits; a RowSparseNDArray of grad's shape
"""

from __future__ import annotations

from typing import Any

import mxnet as mx
import numpy as np

from byteps.common import api
from byteps.common.frontend import collectives as front
from byteps.common.frontend.row_sparse import job_takes_row_sparse
from byteps.common.frontend.row_sparse import table_name as front_table_name
from byteps.common.row_sparse import SparseRows

__all__ = ["ROW_SPARSE_DTYPES", "start", "table_name", "takes_row_sparse"]

#: Value dtypes of the row-sparse push_pull that MXNet arrays hold (byteps.common.row_sparse.SPARSE_DTYPES).
ROW_SPARSE_DTYPES = (np.float16, np.float32, np.float64)


def takes_row_sparse(grad: Any, op: Any, process_set: Any) -> bool:
    """Whether the ``row_sparse`` array ``grad`` is reduced by a row-sparse push_pull rather than densely."""
    return (job_takes_row_sparse(op, process_set) and getattr(grad, "stype", "default") == "row_sparse"
            and np.dtype(grad.dtype) in ROW_SPARSE_DTYPES and all(size > 0 for size in grad.shape))


def table_name(name: str, grad: Any) -> str:
    """The table of ``name`` used with ``grad``'s layout (one table per name, shape and dtype, as in torch)."""
    return front_table_name(name, grad.shape, np.dtype(grad.dtype).name)


def start(grad: Any, name: str, average: bool, scale: float = 1.0) -> front.Started:
    """Start the row-sparse push_pull of the ``row_sparse`` ``grad`` (its rows times ``scale`` first) under
    ``name``'s table; the returned :class:`~byteps.common.frontend.collectives.Started`'s ``finish()`` waits and
    gives the result as a ``RowSparseNDArray`` of ``grad``'s shape, dtype and context."""
    ids = grad.indices.asnumpy().astype(np.int64, copy=False)  # ascending and unique in a RowSparseNDArray
    rows = grad.data.asnumpy()
    if scale != 1.0:
        rows = (rows * scale).astype(rows.dtype, copy=False)
    shape, context = grad.shape, grad.context
    handle = api.worker().sparse_push_pull_async(ids, rows, table_name(name, grad), shape[0], tuple(shape[1:]),
                                                 average)
    return front.Started(handle, lambda: _row_sparse_array(handle.wait(), shape, grad.dtype, context))


def _row_sparse_array(result: SparseRows, shape: Any, dtype: Any, context: Any) -> Any:
    ids, rows = result
    return mx.nd.sparse.row_sparse_array((np.ascontiguousarray(rows), np.ascontiguousarray(ids)), shape=shape,
                                         ctx=context, dtype=dtype)
