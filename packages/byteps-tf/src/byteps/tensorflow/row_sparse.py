"""``tf.IndexedSlices`` gradients through byteps' row-sparse push_pull (docs/sparse.md).

The gradient of ``tf.gather``, ``tf.nn.embedding_lookup`` or a Keras
``Embedding`` is a ``tf.IndexedSlices``: ``values`` of shape
``(n, *row_shape)``, ``indices`` (n row ids, duplicates allowed) and
``dense_shape`` (the table's). That is the (ids, rows) pair a row-sparse
push_pull takes (:meth:`byteps.common.worker.Worker.sparse_push_pull_async`),
with ``num_rows = dense_shape[0]``; what comes back, the union of every
worker's ids (unique, ascending) with their rows summed (or averaged), is a
``tf.IndexedSlices`` of the same ``dense_shape``. Horovod's gather gives every
rank's values and indices uncoalesced instead; applied by an optimizer
(``scatter_add`` of each row) the two are the same update.

:func:`takes_row_sparse` says whether a gradient goes this way: the job must
allow it (servers, any number of worker processes per machine, op Average
or Sum, every rank, no backup workers, synchronous training) and the gradient
must fit it (float16/32/64 or bfloat16 values of a known row shape, a dense
shape). Everything else
keeps the gather of :class:`byteps.tensorflow.reduction.Gather`. Every
condition depends on the job and the gradient's type only, so every rank
takes the same path. The push_pull itself runs in
:mod:`byteps.tensorflow.reduction` (a :class:`~byteps.tensorflow.reduction.RowSparse`
spec), eagerly or inside a graph through ``tf.py_function`` as the other
reductions do. Example::

    if takes_row_sparse(gradient, Average, None):
        spec = RowSparse("DistributedGradientTape.0", average=True)
        values, indices = run_group([spec], inputs(gradient))
"""

from __future__ import annotations

from typing import Any, List, Sequence

import tensorflow as tf

from byteps.common.frontend.row_sparse import job_takes_row_sparse
from byteps.common.frontend.row_sparse import table_name as front_table_name

__all__ = ["ROW_SPARSE_DTYPES", "inputs", "table_name", "takes_row_sparse"]

#: Value dtypes the row-sparse push_pull takes (byteps.common.row_sparse.SPARSE_DTYPES); bfloat16 as
#: ml_dtypes' bfloat16 numpy arrays, which byteps reads as their 16-bit storage.
ROW_SPARSE_DTYPES = (tf.float16, tf.float32, tf.float64, tf.bfloat16)


def takes_row_sparse(gradient: Any, op: Any, process_set: Any) -> bool:
    """Whether the ``tf.IndexedSlices`` ``gradient`` is reduced by a row-sparse push_pull rather than
    gathered."""
    if not isinstance(gradient, tf.IndexedSlices) or gradient.dense_shape is None:
        return False
    if not job_takes_row_sparse(op, process_set):
        return False
    values = gradient.values
    if values.dtype not in ROW_SPARSE_DTYPES or values.shape.rank is None or values.shape.rank < 1:
        return False
    row_shape = values.shape[1:]
    return row_shape.is_fully_defined() and all(size > 0 for size in row_shape.as_list())


def inputs(gradient: tf.IndexedSlices) -> List[tf.Tensor]:
    """What a :class:`~byteps.tensorflow.reduction.RowSparse` spec takes: values, indices, dense shape."""
    return [gradient.values, gradient.indices, tf.cast(gradient.dense_shape, tf.int64)]


def table_name(name: str, dense_shape: Sequence[int], dtype: tf.DType) -> str:
    """The table of a gradient's push_pull ``name`` used with this layout: one table per (name, shape,
    dtype), as the dense path gives each layout of a name a tensor of its own (a tape's gradient *i* may be
    another variable's in another call)."""
    return front_table_name(name, dense_shape, tf.as_dtype(dtype).name)

