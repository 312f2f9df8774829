"""byteps for PyTorch: a Horovod drop-in over byteps parameter servers.

Change ``import horovod.torch as hvd`` to ``import byteps.torch as hvd`` (or
``bps``) and launch with ``bpslaunch``::

    import torch
    import byteps.torch as bps

    bps.init()
    model = torch.nn.Linear(10, 1)
    optimizer = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * bps.size()),
                                         named_parameters=model.named_parameters())
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bps.broadcast_optimizer_state(optimizer, root_rank=0)

    $ bpslaunch -np 2 -- python train.py

The compiled part (``byteps.torch._C``) reads tensors through DLPack and does
not link libtorch, so any torch version with DLPack export works.
"""

try:
    import torch
except ImportError as exc:
    raise ImportError("byteps.torch needs PyTorch: pip install torch") from exc

from byteps.common.interface import require_interface

#: Oldest torch with everything used here (untyped_storage, post-accumulate-grad hooks).
MINIMUM_TORCH = (2, 1)

require_interface("byteps-common", "byteps.common", (3, 6), requirer="byteps-torch")

from byteps.common.frontend.versions import require_framework  # noqa: E402

require_framework("byteps-torch", "torch", torch.__version__, MINIMUM_TORCH)

from byteps.common import PushPullError  # noqa: E402
from byteps.common.frontend import builds as _builds  # noqa: E402
from byteps.common.frontend import process as _process  # noqa: E402
from byteps.common.frontend.builds import *  # noqa: E402,F403  (mpi_built, gloo_built, nccl_built, ...)
from byteps.common.frontend.process import *  # noqa: E402,F403  (init, shutdown, size, rank, barrier, join, ...)
from byteps.common.frontend.process_sets import (  # noqa: E402
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
from byteps.common.frontend.reductions import Adasum, Average, Max, Min, Product, Sum  # noqa: E402
from byteps.torch import elastic, parallel  # noqa: E402  (elastic: Horovod's hvd.elastic)
from byteps.torch.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from byteps.torch.collectives import (  # noqa: E402
    allgather,
    allgather_async,
    allgather_object,
    alltoall,
    alltoall_async,
    grouped_allgather,
    grouped_allgather_async,
    grouped_reducescatter,
    grouped_reducescatter_async,
    reducescatter,
    reducescatter_async,
    sparse_allreduce_async,
)
from byteps.torch.compression import Compression, Compressor  # noqa: E402
from byteps.torch.functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters  # noqa: E402
from byteps.torch.group_ops import push_pull_group_async  # noqa: E402
from byteps.torch.horovod_ops import (  # noqa: E402
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
)
from byteps.torch.ops import (  # noqa: E402
    declare,
    get_pushpull_speed,
    handle_done_callback,
    poll,
    push_pull,
    push_pull_async,
    push_pull_async_inplace,
    push_pull_inplace,
    synchronize,
)
from byteps.torch.optimizer import DistributedOptimizer  # noqa: E402
from byteps.torch.server_embedding import ServerEmbedding  # noqa: E402
from byteps.torch.sync_batch_norm import SyncBatchNorm  # noqa: E402

#: This package's interface, for packages built on it (byteps.common.interface).
INTERFACE_VERSION = (1, 0)

__all__ = [
    "INTERFACE_VERSION",
    *_process.__all__,  # init, shutdown, is_initialized, size, rank, local_size, local_rank, barrier, join
    # BytePS names
    "declare", "push_pull", "push_pull_async", "push_pull_inplace", "push_pull_async_inplace",
    "push_pull_group_async", "poll", "synchronize", "handle_done_callback", "get_pushpull_speed",
    # Horovod names
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async", "allgather_object",
    "alltoall", "alltoall_async",
    "reducescatter", "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async",
    "sparse_allreduce_async", "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    *_builds.__all__,  # mpi_built, gloo_built, nccl_built, ..., HorovodInternalError, start/stop_timeline
    "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "Compression", "Compressor",
    "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
    "save_checkpoint", "load_checkpoint", "SyncBatchNorm",
    "DistributedOptimizer", "parallel", "elastic",
    "PushPullError", "ServerEmbedding",
]
