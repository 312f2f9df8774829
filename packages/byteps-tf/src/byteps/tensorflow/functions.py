"""Broadcast variables and picklable objects from one rank to all.

Example, before training::

    bps.broadcast_variables(model.variables, root_rank=0)
    bps.broadcast_variables(optimizer.variables, root_rank=0)
    epoch = bps.broadcast_object(epoch, root_rank=0, name="epoch")

Every rank makes the same calls in the same order with the same variables
(same shapes and dtypes); the variables of one call travel as one group,
pipelined.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional

import tensorflow as tf

from byteps.common.frontend import broadcast_object as _broadcast_object
from byteps.common.frontend.process_sets import broadcast_view
from byteps.tensorflow.graph_ops import run_group
from byteps.tensorflow.ops import _check_root, check_process_set, rank
from byteps.tensorflow.reduction import Reduce
from byteps.tensorflow.tensors import widen

__all__ = ["broadcast_variables", "broadcast_", "broadcast_global_variables", "broadcast_object"]


def broadcast_variables(variables: Iterable[Any], root_rank: int, process_set: Any = None,
                        inplace: bool = False) -> Optional[tf.Operation]:
    """Assign the root's values to ``variables`` on every rank.

    Takes ``tf.Variable`` and Keras variables (``model.variables``,
    ``optimizer.variables``). Returns the grouped assign op in graph mode,
    None eagerly. Variable *i* of a call travels as ``broadcast_variables.<i>``;
    bool and 8/16-bit integers as int32, uint32 as int64.

    ``process_set``: among that set's ranks only (``root_rank``, a global
    rank, must be one of them); a rank outside the set gets a ValueError
    naming the set, as every collective of a set does.
    """
    variables = list(variables)
    if not variables:  # nothing to send: no op, and no need of init() (Horovod's graph-mode rule)
        if process_set is not None:
            check_process_set(process_set)
        return tf.group()
    assigns = _assign_from_root(variables, root_rank, process_set, "broadcast_variables")
    if tf.executing_eagerly():
        return None
    return tf.group(*[a for a in assigns if a is not None])


def broadcast_(variables: Iterable[Any], root_rank: int, name: Optional[str] = None,
               process_set: Any = None) -> List[Any]:
    """Horovod's in-place broadcast: the root's values into ``variables``; returns their new values
    (eagerly the variables themselves; in a graph the assigned values, whose evaluation runs it)."""
    variables = list(variables)
    if not variables:
        return []
    assigns = _assign_from_root(variables, root_rank, process_set, f"broadcast_.{name}" if name else "broadcast_")
    return variables if tf.executing_eagerly() else assigns


def _assign_from_root(variables: List[Any], root_rank: int, process_set: Any, prefix: str) -> List[Any]:
    """Broadcast each variable's value from ``root_rank`` (as ``<prefix>.<i>``) and assign it; the assigns."""
    view = broadcast_view(root_rank, process_set, prefix)
    values = []
    for variable in variables:
        value = tf.convert_to_tensor(variable)
        values.append(tf.cast(value, widen(value.dtype)) if widen(value.dtype) != value.dtype else value)
    contribute = rank() == root_rank
    specs = [Reduce(f"{prefix}.{i}", average=False, contribute=contribute, root=int(root_rank),
                    view=view if view.set_id else None)
             for i in range(len(values))]
    results = run_group(specs, values)
    return [variable.assign(tf.cast(result, tf.as_dtype(variable.dtype)))
            for variable, result in zip(variables, results)]


def broadcast_global_variables(root_rank: int) -> tf.Operation:
    """Broadcast ``tf.compat.v1.global_variables()`` (TF1 graphs only), as Horovod does.

    TensorFlow 2 has no global variable collection: eagerly or inside
    ``tf.function`` this is a RuntimeError saying what to use instead.
    """
    if tf.executing_eagerly() or tf.inside_function():
        raise RuntimeError(
            "broadcast_global_variables() needs a TF1 graph: TensorFlow 2 has no global variable collection "
            "eagerly or in tf.function. Use bps.broadcast_variables(model.variables, root_rank) (and the "
            "optimizer's variables), or with Keras the callback bps.callbacks.BroadcastGlobalVariablesCallback")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None, name: Optional[str] = None,
                     process_set: Any = None) -> Any:
    """Return the root's ``obj`` on every rank (pickled), eagerly or in a TF1 graph (not inside tf.function).

    The root gets its own ``obj`` back; the others may pass anything (None).
    The bytes travel as int64 words in a buffer rounded up to a power of two,
    so repeated calls reuse a few tensor names (byteps-common's front,
    :func:`byteps.common.frontend.broadcast_object`).
    """
    _check_root(root_rank)
    if tf.inside_function():
        raise RuntimeError("broadcast_object() sends Python objects when called: call it outside tf.function")
    return _broadcast_object(obj, root_rank, name, process_set)
