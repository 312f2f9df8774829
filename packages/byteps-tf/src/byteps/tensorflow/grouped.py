"""Horovod's ``grouped_allreduce`` for TensorFlow: several tensors reduced as one group.

Over every rank, the tensors go as one grouped push_pull (small ones fused,
see :mod:`byteps.tensorflow.reduction`); with ``op=Min/Max/Product`` or a
process set, one op each. Differentiable (by Average and Sum), eager or in
``tf.function``::

    a, b = bps.grouped_allreduce([tf.ones(3), tf.ones([2, 2])], op=bps.Sum)
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import tensorflow as tf

from byteps.common.frontend.process_sets import rank_view
from byteps.common.frontend.reductions import BY_GATHER, average_of
from byteps.tensorflow.compression import Compression
from byteps.tensorflow.ops import allreduce, resolve_name
from byteps.tensorflow.tensors import byteps_dtype

__all__ = ["grouped_allreduce"]


def grouped_allreduce(tensors: Sequence[Any], average: Optional[bool] = None, device_dense: str = "",
                      device_sparse: str = "", compression: Any = Compression.none, op: Optional[int] = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0, name: Optional[str] = None,
                      process_set: Any = None, ignore_name_scope: bool = False) -> List[tf.Tensor]:
    """:func:`byteps.tensorflow.allreduce` of each tensor, as one group where byteps can fuse them.

    ``prescale_factor`` multiplies every tensor before the reduction,
    ``postscale_factor`` every result after it, as in :func:`allreduce`
    (fused all the same).

    ``tf.IndexedSlices`` among them are gathered as :func:`allreduce` gathers
    them (Average and Sum only, as in Horovod); the dense ones stay one group.
    """
    if any(isinstance(t, tf.IndexedSlices) for t in tensors):
        return _grouped_with_slices(list(tensors), average, compression, op, prescale_factor, postscale_factor,
                                    name, process_set)
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    base = resolve_name("grouped_allreduce", name, tensors[0])
    names = [f"{base}.{i}" for i in range(len(tensors))]
    fusable = (op not in BY_GATHER and rank_view(process_set).set_id == 0 and compression is Compression.none
               and all(_reduced_as_is(t) for t in tensors))
    if not fusable:
        return [allreduce(t, average, compression=compression, op=op, prescale_factor=prescale_factor,
                          postscale_factor=postscale_factor, name=n, process_set=process_set)
                for t, n in zip(tensors, names)]
    from byteps.tensorflow.collectives import _scaled
    from byteps.tensorflow.ops import _differentiable_group
    reduced = _differentiable_group([_scaled(t, prescale_factor) for t in tensors], names, average_of(op, average))
    return [_scaled(t, postscale_factor) for t in reduced]


def _grouped_with_slices(tensors: List[Any], average: Optional[bool], compression: Any, op: Optional[int],
                         prescale_factor: float, postscale_factor: float, name: Optional[str],
                         process_set: Any) -> List[Any]:
    """The slices gathered one by one, the dense tensors as one group, results in the caller's order.

    The slices go first, so allreduce's refusal of ops other than Average and Sum for them comes before
    anything is sent."""
    first = tensors[0].values if isinstance(tensors[0], tf.IndexedSlices) else tensors[0]
    base = resolve_name("grouped_allreduce", name, first)
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    results: List[Any] = [None] * len(tensors)
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            results[i] = allreduce(t, average, op=op, prescale_factor=prescale_factor,
                                   postscale_factor=postscale_factor, name=f"{base}.slices.{i}",
                                   process_set=process_set)
    reduced = grouped_allreduce([tensors[i] for i in dense], average, compression=compression, op=op,
                                prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                name=f"{base}.dense", process_set=process_set)
    for i, result in zip(dense, reduced):
        results[i] = result
    return results


def _reduced_as_is(tensor: tf.Tensor) -> bool:
    try:
        byteps_dtype(tensor.dtype, "")
    except ValueError:
        return False
    return True
