"""Horovod's ``rank_op``, ``size_op``, ``local_rank_op`` and ``local_size_op``: the process calls as int32 ops;
and ``join``, which inside a ``tf.function`` or a TF1 graph is an op that joins each time it runs.

Each is read when the op runs, not when it is built: a TF1 graph built
before ``init()`` gives the right value once it runs after it, as Horovod's
ops do. Eagerly they return the value at once. Example::

    rank = bps.rank_op()          # tf.Tensor(0, shape=(), dtype=int32) on rank 0
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from byteps.common.frontend import process

__all__ = ["rank_op", "size_op", "local_rank_op", "local_size_op", "join"]


def _read(value: Callable[[], int], name: Optional[str]) -> tf.Tensor:
    if tf.executing_eagerly():
        return tf.constant(value(), dtype=tf.int32)
    return _graph_op(value, name)


def _graph_op(value: Callable[[], int], name: Optional[str]) -> tf.Tensor:
    """``value()`` as an int32 scalar op of the graph being built, called each time the op runs."""
    result = tf.py_function(lambda: np.int32(value()), [], tf.int32, name=name)
    result.set_shape([])
    return result


def rank_op(name: Optional[str] = None) -> tf.Tensor:
    """This process's rank, as an int32 scalar op."""
    return _read(process.rank, name)


def local_rank_op(name: Optional[str] = None) -> tf.Tensor:
    """This process's rank on its machine, as an int32 scalar op."""
    return _read(process.local_rank, name)


def local_size_op(name: Optional[str] = None) -> tf.Tensor:
    """The number of worker processes on this machine, as an int32 scalar op."""
    return _read(process.local_size, name)


def size_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """The number of ranks (of the global set; other process sets: pass their ProcessSet's size()), int32."""
    if process_set_id != 0:
        raise NotImplementedError("size_op(process_set_id=...): use the ProcessSet's size() for a process set")
    return _read(process.size, name)


def join(device: int = -1) -> object:
    """Horovod's join for uneven data (:func:`byteps.common.frontend.process.join`): eagerly, the rank that
    joined last (an int); inside a ``tf.function`` or a TF1 graph, an int32 op that joins when it runs, each
    time (as Horovod's join op), not once when the function is traced."""
    if tf.executing_eagerly():
        return process.join(device)
    return _graph_op(lambda: process.join(device), "byteps_join")
