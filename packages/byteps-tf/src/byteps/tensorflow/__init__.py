"""byteps for TensorFlow 2: a Horovod drop-in over byteps parameter servers.

Change ``import horovod.tensorflow as hvd`` to ``import byteps.tensorflow as hvd``
(or ``bps``) and launch with ``bpslaunch``::

    import tensorflow as tf
    import byteps.tensorflow as bps

    bps.init()
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(0.01 * bps.size())
    bps.broadcast_variables(model.variables, root_rank=0)    # everyone starts from rank 0's weights

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        tape = bps.DistributedGradientTape(tape)              # gradients averaged over all workers
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    $ bpslaunch -np 2 -- python train.py

Keras users: ``import byteps.tensorflow.keras as bps`` (or ``byteps.keras``).
The compiled part (``byteps.tensorflow._C``) exchanges tensors with
TensorFlow through DLPack and does not link TensorFlow.
"""

try:
    import tensorflow as tf
except ImportError as exc:
    raise ImportError("byteps.tensorflow needs TensorFlow: pip install tensorflow (or tensorflow-cpu)") from exc

from byteps.common.interface import require_interface

#: Oldest TensorFlow this package is tested against the API of (Keras 3 is its default from 2.16 on).
MINIMUM_TENSORFLOW = (2, 16)

require_interface("byteps-common", "byteps.common", (3, 6), requirer="byteps-tf")

from byteps.common.frontend.versions import require_framework  # noqa: E402

require_framework("byteps-tf", "tensorflow", getattr(tf, "__version__", "unknown"), MINIMUM_TENSORFLOW)

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
from byteps.tensorflow import elastic, util  # noqa: E402,F401  (Horovod's hvd.elastic and hvd.util)
from byteps.tensorflow.collectives import (  # noqa: E402
    allgather_object,
    alltoall,
    grouped_allgather,
    grouped_reducescatter,
    reducescatter,
)
from byteps.tensorflow.compression import Compression, Compressor  # noqa: E402
from byteps.tensorflow.functions import (  # noqa: E402
    broadcast_,
    broadcast_global_variables,
    broadcast_object,
    broadcast_variables,
)
from byteps.tensorflow.gradient_tape import (  # noqa: E402
    DistributedGradientTape,
    PartialDistributedGradientTape,
    skip_step,
)
from byteps.tensorflow.grouped import grouped_allreduce  # noqa: E402
from byteps.tensorflow.ops import allgather, allreduce, broadcast, push_pull  # noqa: E402
from byteps.tensorflow.optimizer import DistributedOptimizer  # noqa: E402
from byteps.tensorflow.process_ops import join, local_rank_op, local_size_op, rank_op, size_op  # noqa: E402,F401  (join: in __all__ through process, an op in graphs)
from byteps.tensorflow.util import _executing_eagerly  # noqa: E402,F401  (Horovod's private helper)

#: This package's interface, for packages built on it (byteps.common.interface).
INTERFACE_VERSION = (1, 0)


__all__ = [
    "elastic",
    "INTERFACE_VERSION",
    *_process.__all__,  # init, shutdown, is_initialized, size, rank, local_size, local_rank, barrier, join
    "rank_op", "size_op", "local_rank_op", "local_size_op",
    # reductions
    "push_pull", "allreduce", "broadcast", "allgather", "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "grouped_allreduce", "grouped_allgather", "alltoall", "reducescatter", "grouped_reducescatter", "allgather_object",
    "Compression", "Compressor",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    *_builds.__all__,  # mpi_built, gloo_built, nccl_built, ..., HorovodInternalError, start/stop_timeline
    # variables and objects
    "broadcast_variables", "broadcast_", "broadcast_global_variables", "broadcast_object",
    # training
    "DistributedGradientTape", "PartialDistributedGradientTape", "DistributedOptimizer", "SyncBatchNormalization",  # noqa: F405  (lazy, below)
    "ServerEmbedding",  # noqa: F405  (lazy, below; a table held by the servers: ours, not Horovod's)
    "skip_step",  # backup workers (BYTEPS_BACKUP_WORKERS): ours, not Horovod's
    "PushPullError",
]


def __getattr__(name: str):
    """``SyncBatchNormalization`` and ``ServerEmbedding`` are Keras layers: Keras is imported when one is first
    used, not here."""
    if name == "SyncBatchNormalization":
        from byteps.tensorflow.sync_batch_norm import SyncBatchNormalization
        return SyncBatchNormalization
    if name == "ServerEmbedding":
        from byteps.tensorflow.server_embedding import ServerEmbedding
        return ServerEmbedding
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
