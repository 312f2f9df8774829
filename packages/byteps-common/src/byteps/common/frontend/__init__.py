"""The front every framework adapter shares: written once, bound to a tensor type by each adapter.

byteps.torch, byteps.tensorflow (and its Keras API) and byteps.mxnet offer
the same Horovod/BytePS API over one byteps-common worker. What does not
depend on the framework lives here, one idea per module:

* :mod:`~.process`: init, shutdown, size, rank, local_*, barrier, join, and
  hooks for an adapter's own state around init and shutdown;
* :mod:`~.reductions`: the ops (Average, Sum, Adasum, Min, Max, Product,
  with Horovod's values) and :func:`average_of`;
* :mod:`~.names`: default names (``<op>.noname.<n>``), one byteps tensor per
  layout a name is used with (``name#k``), names in flight;
* :mod:`~.default_slots`: which of an op's 16 default names an unnamed call
  gets, alike on every rank;
* :mod:`~.handle_table`: integer handles, their finishing steps, the speed meter;
* :mod:`~.compression`: Horovod's Compressor interface and fp16, through a
  :class:`~.binding.TensorBinding`;
* :mod:`~.group`: grouped push_pulls with small tensors fused, through the
  same binding;
* :mod:`~.async_training`: BYTEPS_ENABLE_ASYNC's parameter exchange (the
  initial broadcast into the servers' store, a delta per step, and the
  servers' store taken at an elastic commit);
* :mod:`~.row_sparse`: whether the job reduces sparse gradients by a
  row-sparse push_pull (the adapters add whether a gradient fits);
* :mod:`~.checks`, :mod:`~.objects`, :mod:`~.versions`: argument checks with
  their messages, broadcast_object, framework version checks.

No framework is imported here. An adapter keeps what only it can do:
tensor views and device staging, ordering on its engine or graph, and its
optimizer, trainer and callback wrappers. Example (an adapter's module)::

    from byteps.common.frontend import Average, Sum, average_of, init, rank, size
"""

from byteps.common.frontend.async_training import (
    ParameterExchange,
    Snapshots,
    async_enabled,
    check_async_compression,
    commit_exchanges,
)
from byteps.common.frontend.binding import TensorBinding, dtype_table
from byteps.common.frontend.checks import check_passes, check_root, check_scale
from byteps.common.frontend.compression import Compressor, FP16Compressor, NoneCompressor, compression_for
from byteps.common.frontend.handle_table import HandleTable, PendingOp, SpeedMeter
from byteps.common.frontend.names import TensorNames, check_name
from byteps.common.frontend.objects import broadcast_object
from byteps.common.frontend.process import (
    after_shutdown,
    barrier,
    before_shutdown,
    init,
    is_initialized,
    join,
    local_rank,
    local_size,
    on_init,
    rank,
    shutdown,
    size,
)
from byteps.common.frontend.reductions import (
    OP_NAMES,
    Adasum,
    Average,
    Max,
    Min,
    OpSpec,
    Product,
    Sum,
    average_of,
    check_gradient_op,
    op_name,
)
from byteps.common.frontend.versions import require_framework, version_tuple

__all__ = [
    # process
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "barrier", "join",
    "on_init", "before_shutdown", "after_shutdown",
    # reductions
    "Average", "Sum", "Adasum", "Min", "Max", "Product", "OP_NAMES", "op_name", "average_of", "check_gradient_op",
    "OpSpec",
    # names, handles, compression
    "TensorNames", "check_name", "HandleTable", "PendingOp", "SpeedMeter",
    "TensorBinding", "dtype_table", "Compressor", "NoneCompressor", "FP16Compressor", "compression_for",
    # checks, objects, versions
    "check_root", "check_scale", "check_passes", "broadcast_object", "require_framework", "version_tuple",
    # asynchronous training
    "ParameterExchange", "Snapshots", "async_enabled", "check_async_compression", "commit_exchanges",
]
