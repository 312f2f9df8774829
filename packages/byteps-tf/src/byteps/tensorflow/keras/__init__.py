"""byteps for Keras (TensorFlow backend): a drop-in for ``horovod.tensorflow.keras``.

Keras 3, or Keras 2 (tf_keras) when ``TF_USE_LEGACY_KERAS=1`` makes it
``tf.keras`` (:mod:`byteps.tensorflow.which_keras`).

Change ``import horovod.tensorflow.keras as hvd`` (or ``horovod.keras``) to
``import byteps.tensorflow.keras as hvd`` (or ``byteps.keras``)::

    import keras
    import byteps.tensorflow.keras as bps

    bps.init()
    model.compile(optimizer=bps.DistributedOptimizer(keras.optimizers.SGD(0.01 * bps.size())),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, callbacks=[bps.callbacks.BroadcastGlobalVariablesCallback(0),
                               bps.callbacks.MetricAverageCallback()],
              verbose=1 if bps.rank() == 0 else 0)

    $ bpslaunch --workers 2 --servers 1 -- python train.py
"""

from byteps.tensorflow.which_keras import KERAS2, keras

if not KERAS2 and keras.backend.backend() != "tensorflow":
    raise ImportError(f"byteps.tensorflow.keras needs Keras's TensorFlow backend, this process uses "
                      f"{keras.backend.backend()!r}: set KERAS_BACKEND=tensorflow")

from typing import Any, Optional  # noqa: E402

import tensorflow as tf  # noqa: E402

from byteps.common import PushPullError  # noqa: E402
from byteps.common.frontend.process import *  # noqa: E402,F403  (init, shutdown, size, rank, barrier, ...)
from byteps.common.frontend.reductions import Average, Sum  # noqa: E402
from byteps.tensorflow import functions as _functions  # noqa: E402
from byteps.tensorflow import ops as _ops  # noqa: E402
from byteps.tensorflow.compression import Compression, Compressor  # noqa: E402
from byteps.tensorflow.keras import (
    callbacks,  # noqa: E402
    elastic,  # noqa: E402  (Horovod's hvd.elastic)
)
from byteps.tensorflow.keras.model_io import load_model  # noqa: E402
from byteps.tensorflow.keras.optimizer import DistributedOptimizer, PartialDistributedOptimizer  # noqa: E402
from byteps.tensorflow.server_embedding import ServerEmbedding  # noqa: E402  (a layer: a table held by the servers)

__all__ = [  # noqa: F405  (the process names come from byteps.common.frontend.process)
    "elastic",
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "barrier",
    "DistributedOptimizer", "PartialDistributedOptimizer", "broadcast_global_variables",
    "push_pull", "allreduce", "broadcast", "allgather",
    "load_model", "callbacks", "Compression", "Compressor", "Average", "Sum", "PushPullError",
    "ServerEmbedding",
]


def push_pull(value: Any, average: bool = True, name: Optional[str] = None,
              compression: Any = Compression.none) -> tf.Tensor:
    """Average (or sum) a tensor-like value over all workers (BytePS's name)."""
    return _ops.push_pull(tf.convert_to_tensor(value), average=average, name=name, compression=compression)


def allreduce(value: Any, name: Optional[str] = None, average: Optional[bool] = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, op: Optional[int] = None,
              compression: Any = Compression.none) -> tf.Tensor:
    """Horovod's Keras allreduce: average (default) or sum a tensor-like value over all workers."""
    return _ops.allreduce(tf.convert_to_tensor(value), average=average, compression=compression, op=op,
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor, name=name)


def broadcast(value: Any, root_rank: int, name: Optional[str] = None) -> tf.Tensor:
    """The root's value on every rank."""
    return _ops.broadcast(tf.convert_to_tensor(value), root_rank, name=name)


def allgather(value: Any, name: Optional[str] = None) -> tf.Tensor:
    """Every rank's value concatenated along the first dimension, in rank order."""
    return _ops.allgather(tf.convert_to_tensor(value), name=name)


def broadcast_global_variables(root_rank: int) -> Any:
    """Horovod's Keras ``broadcast_global_variables``: TF1 graphs only (see the TF version).

    With Keras 3 use ``callbacks.BroadcastGlobalVariablesCallback(root_rank)``
    or ``byteps.tensorflow.broadcast_variables(model.variables, root_rank)``.
    """
    return _functions.broadcast_global_variables(root_rank)
