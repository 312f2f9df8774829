"""byteps-common: the framework-neutral core of a byteps worker.

It holds the typed configuration (every DMLC_*/BYTEPS_* knob), the dtypes
and reduction kernels, tensor partitioning, and the worker API that
framework adapters build on::

    import byteps.common as bps
    bps.init()
    bps.push_pull(numpy_array, name="grad")   # averaged over all workers, in place
"""

from byteps.common.interface import require_interface

# 2.1: compression, tracing, asynchronous keys and the front's ParameterExchange, backup workers (quorum keys,
# skipping_round); 2.0: frontend, sealed transport; 1.1: local aggregation, declare sizes, topology;
# 2.3: push_pull_async(skip_pull=); 2.4: elastic membership boards (a worker on another host reads its epoch
# from bpslaunch's rendezvous service; epoch secrets derived from the elastic key); 2.5: Config.enable_ipc,
# frontend.process_sets.reduction_spec and broadcast_spec; 2.6: local aggregation of CUDA tensors on the GPU
# (Config.gpu_local_aggregation, CopyEngine.shared_memory/open_shared/reduce); 2.7: asynchronous training across
# elastic membership epochs (ParameterExchange(at_commit=), .pull, .started per job, commit_exchanges);
# 3.0: Worker.push_pull_async(tensor, name, PushPullOptions) (every caller's choices in one options object), the
# engine package byteps.common.engine (comm_loop, route, server_exchange, local_aggregation, device_local and
# compression.stages moved there), Config.max_partition_bytes; 3.1: compression.warn_if_feedback_meets_momentum
# and FeedbackMomentumWarning, Config.shutdown_leaves_job and Worker.shutdown_leaves_job (role mode's shutdown);
# 3.2: row-sparse push_pull (Worker.sparse_push_pull, byteps.common.row_sparse, PartitionSpec.sparse); 3.3: rows
# in parts, several processes per machine, bfloat16; 3.4: a machine's rows summed by its table's local root
# (byteps.common.engine.sparse_local), row-sparse on one machine without servers, wire protocol v5
# 3.5: default names by slot, server-held tables; 3.6: asynchronous server-held tables (PartitionSpec takes
# asynchronous with held), held tables saved at elastic commits (elastic.held_tables) and in checkpoints
# (frontend.checkpoint.save_held_tables / load_held_tables)
INTERFACE_VERSION = (3, 6)

require_interface("byteps-transport", "byteps.transport", (2, 12), requirer="byteps-common")

from byteps.common.api import (  # noqa: E402
    barrier,
    declare,
    init,
    is_initialized,
    local_rank,
    local_size,
    poll,
    push_pull,
    push_pull_async,
    push_pull_group_async,
    rank,
    shutdown,
    size,
    sparse_push_pull,
    synchronize,
)
from byteps.common.config import Config, ConfigError  # noqa: E402
from byteps.common.dtypes import DType  # noqa: E402
from byteps.common.handle import Handle, JobLost, PushPullError  # noqa: E402
from byteps.common.native import get_include  # noqa: E402
from byteps.common.options import PushPullOptions  # noqa: E402
from byteps.common.row_sparse import SparseRows  # noqa: E402
from byteps.common.worker import Worker  # noqa: E402

__all__ = [
    "INTERFACE_VERSION",
    "Config",
    "ConfigError",
    "DType",
    "Handle",
    "PushPullError",
    "PushPullOptions",
    "JobLost",
    "SparseRows",
    "Worker",
    "barrier",
    "declare",
    "get_include",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "poll",
    "push_pull",
    "push_pull_async",
    "push_pull_group_async",
    "rank",
    "shutdown",
    "size",
    "sparse_push_pull",
    "synchronize",
]
