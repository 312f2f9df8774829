"""Whether a job reduces an adapter's sparse gradients by a row-sparse push_pull, and the table a gradient
goes to (docs/sparse.md).

The job's half of the rule every adapter applies before it looks at the
gradient itself: the adapters take the row-sparse push_pull in every
layout of several worker processes (through servers, or one machine's
processes summing by id among themselves; ``join()`` works after it in
both), not for backup workers' quorum or asynchronous training, which it
has no round for, and over every rank with ``op`` Average or Sum;
``BYTEPS_ROW_SPARSE=0`` keeps Horovod's ways everywhere. Each condition is the same on every rank, so every
rank takes the same path. Example (an adapter)::

    if job_takes_row_sparse(op, process_set) and gradient_fits(gradient):
        ...   # row-sparse; else the gather of indices and values, as Horovod
"""

from __future__ import annotations

from typing import Any, Sequence

from byteps.common import api
from byteps.common.frontend.async_training import async_enabled
from byteps.common.frontend.process_sets import rank_view
from byteps.common.frontend.reductions import Average, Sum

__all__ = ["job_takes_row_sparse", "table_name"]


def job_takes_row_sparse(op: Any, process_set: Any) -> bool:
    """Whether this job reduces a fitting sparse gradient of ``op`` over ``process_set`` row-sparse."""
    if not api.is_initialized() or op not in (Average, Sum):
        return False
    worker = api.worker()
    if (not worker.is_distributed or not worker.config.row_sparse or worker.config.backup_workers
            or async_enabled()):
        return False
    return not rank_view(process_set).set_id


def table_name(name: str, shape: Sequence[int], dtype: str) -> str:
    """The table of ``name`` used with a gradient of ``shape`` and ``dtype`` (its name, e.g. ``"float32"``):
    one table per (name, shape, dtype), as the dense path gives each layout of a name a tensor of its own,
    so a name (a default one, or a tape's gradient *i* that is another variable's in another call) may come
    back with another shape: ``table_name("g", (1000, 16), "float32") == "g[1000x16 float32]"``."""
    return f"{name}[{'x'.join(str(int(size)) for size in shape)} {dtype}]"
