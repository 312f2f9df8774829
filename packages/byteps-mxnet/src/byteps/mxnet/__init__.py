"""byteps for MXNet: push_pull on NDArrays through MXNet's engine, and Horovod's drop-in names.

BytePS's own MXNet API (``byteps_push_pull``, ``byteps_declare_tensor``,
``DistributedTrainer``) and Horovod's (``allreduce``, ``broadcast``,
``DistributedOptimizer``, ``broadcast_parameters``)::

    import mxnet as mx
    import byteps.mxnet as bps

    bps.init()
    net = mx.gluon.nn.Dense(10, in_units=64)
    net.initialize()
    trainer = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    # ... autograd.record(), loss.backward(), trainer.step(batch_size) as with gluon.Trainer

    $ bpslaunch -np 2 -- python train.py

Every op is asynchronous like an MXNet operator: it returns at once and
later MXNet operations on its result wait for it. The compiled part
(``byteps.mxnet._C``) reads NDArrays through DLPack and queues ops through
MXNet's C API, looked up at import: it does not link libmxnet.
"""

try:
    import mxnet
except (ImportError, AttributeError) as exc:  # AttributeError: mxnet 1.x under numpy >= 1.24 (np.bool)
    import numpy

    raise ImportError(
        f"byteps.mxnet needs MXNet, which cannot be imported ({type(exc).__name__}: {exc}). MXNet 1.x needs "
        f"numpy < 1.24 (numpy {numpy.__version__} is installed): pip install 'mxnet>=1.6,<2' 'numpy<1.24'"
    ) from exc

from byteps.common.interface import require_interface

#: MXNet versions with everything used here (MXEnginePushSyncND, NDArray DLPack export, gluon 1.x).
SUPPORTED_MXNET = ((1, 6), (2, 0))

require_interface("byteps-common", "byteps.common", (3, 6), requirer="byteps-mxnet")

from byteps.common.frontend.versions import require_framework  # noqa: E402

require_framework("byteps-mxnet", "mxnet", mxnet.__version__, *SUPPORTED_MXNET,
                  install="pip install 'mxnet>=1.6,<2' 'numpy<1.24'")

from byteps.mxnet.engine import bind_mxnet  # noqa: E402

bind_mxnet()

from byteps.common import PushPullError  # noqa: E402
from byteps.common.frontend.builds import *  # noqa: E402,F403  (mpi_built ... rocm_built, HorovodInternalError)
from byteps.common.frontend.builds import __all__ as _builds_all  # noqa: E402
from byteps.common.frontend.process import *  # noqa: E402,F403  (init, shutdown, size, rank, ...)
from byteps.common.frontend.process_sets import (  # noqa: E402
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
from byteps.common.frontend.reductions import Adasum, Average, Max, Min, Product, Sum  # noqa: E402
from byteps.mxnet import elastic  # noqa: E402,F401  (Horovod's hvd.elastic: a clear error, see the module)
from byteps.mxnet.collectives import (  # noqa: E402
    allgather,
    allgather_object,
    allreduce_by_gather,
    alltoall,
    broadcast_object,
    grouped_allgather,
    grouped_reducescatter,
    reducescatter,
)
from byteps.mxnet.compression import Compression, Compressor  # noqa: E402
from byteps.mxnet.functions import broadcast_parameters  # noqa: E402
from byteps.mxnet.ops import (  # noqa: E402
    allreduce,
    allreduce_,
    broadcast,
    broadcast_,
    byteps_declare_tensor,
    byteps_push_pull,
    grouped_allreduce,
    grouped_allreduce_,
)
from byteps.mxnet.optimizer import DistributedOptimizer  # noqa: E402
from byteps.mxnet.server_embedding import ServerEmbedding  # noqa: E402
from byteps.mxnet.trainer import DistributedTrainer  # noqa: E402

#: This package's interface, for packages built on it (byteps.common.interface).
INTERFACE_VERSION = (1, 0)

__all__ = [
    "INTERFACE_VERSION",
    # process (byteps.common.frontend.process)
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "barrier", "join",  # noqa: F405
    # process sets and build flags
    "ProcessSet", "add_process_set", "remove_process_set", "global_process_set", *_builds_all,
    # collectives beyond allreduce (synchronous, byteps.mxnet.collectives)
    "allgather", "grouped_allgather", "alltoall", "reducescatter", "grouped_reducescatter", "allreduce_by_gather",
    "allgather_object", "broadcast_object",
    # BytePS names
    "byteps_declare_tensor", "byteps_push_pull", "DistributedTrainer",
    # a table held by the servers (docs/sparse.md)
    "ServerEmbedding",
    # Horovod names
    "allreduce", "allreduce_", "grouped_allreduce", "grouped_allreduce_", "broadcast", "broadcast_",
    "broadcast_parameters", "DistributedOptimizer",
    "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "Compression", "Compressor",
    "PushPullError",
]
