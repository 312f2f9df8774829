"""Average a list of gradients over all workers, as one group of push_pulls.

Shared by :class:`~byteps.tensorflow.DistributedGradientTape`, the TF1 and
the Keras ``DistributedOptimizer``. Gradient *i* of the list is named
``"<prefix>.<i>"``: the list comes from the same code on every rank, so the
names agree without depending on variable names (which Keras makes unique
per process).

* ``None`` stays ``None`` and is not sent (as in Horovod): every rank must
  get ``None`` for the same sources, which the same model code ensures.
* ``tf.IndexedSlices`` (embedding gradients) are densified with
  ``sparse_as_dense=True``; otherwise every rank's values and indices are
  gathered (duplicate indices add up when applied) and, for ``Average``,
  the values divided by the number of workers: the same update as the
  dense average.
* ``gradient_predivide_factor=f`` divides by ``f`` before the sum and
  multiplies by ``f / size()`` after (Horovod), for float16 range.
* With one worker nothing is sent (as in Horovod).
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Sequence

import tensorflow as tf

from byteps.common.frontend import Average, check_gradient_op, size
from byteps.tensorflow.compression import Compression
from byteps.tensorflow.graph_ops import run_group
from byteps.tensorflow.reduction import Gather, Reduce

__all__ = ["GradientReducer"]


@dataclasses.dataclass
class GradientReducer:
    """How one wrapper reduces its gradients (checked at construction)."""

    prefix: str
    compression: Any = Compression.none
    sparse_as_dense: bool = False
    op: int = Average
    gradient_predivide_factor: float = 1.0

    def __post_init__(self) -> None:
        check_gradient_op(self.op, self.gradient_predivide_factor)

    def reduce(self, gradients: Sequence[Optional[Any]]) -> List[Optional[Any]]:
        """The reduced gradients, in order (eager or in a graph)."""
        gradients = list(gradients)
        if size() == 1:
            return gradients
        average = self.op == Average
        predivide = self.gradient_predivide_factor
        specs, inputs, finishers = [], [], []
        for i, gradient in enumerate(gradients):
            if gradient is None:
                continue
            name = f"{self.prefix}.{i}"
            if isinstance(gradient, tf.IndexedSlices) and not self.sparse_as_dense:
                specs.append(Gather(name, parts=2))
                inputs.extend([gradient.values, gradient.indices])
                finishers.append((i, self._sparse_finisher(gradient, average)))
                continue
            dense = tf.convert_to_tensor(gradient)
            if average and predivide != 1.0:
                dense = dense / tf.cast(predivide, dense.dtype)
            sent, ctx = self.compression.compress(dense)
            specs.append(Reduce(name, average=average and predivide == 1.0))
            inputs.append(sent)
            finishers.append((i, self._dense_finisher(ctx, predivide / size() if average and predivide != 1.0
                                                      else 1.0)))
        outputs = run_group(specs, inputs)
        reduced: List[Optional[Any]] = [None] * len(gradients)
        position = 0
        for spec, (i, finish) in zip(specs, finishers):
            count = spec.outputs()
            reduced[i] = finish(outputs[position:position + count])
            position += count
        return reduced

    def _dense_finisher(self, ctx: Any, postscale: float):
        def finish(outputs: List[tf.Tensor]) -> tf.Tensor:
            result = self.compression.decompress(outputs[0], ctx)
            return result * tf.cast(postscale, result.dtype) if postscale != 1.0 else result
        return finish

    @staticmethod
    def _sparse_finisher(local: tf.IndexedSlices, average: bool):
        def finish(outputs: List[tf.Tensor]) -> tf.IndexedSlices:
            values, indices = outputs[0], outputs[1]
            if average:
                values = values / tf.cast(size(), values.dtype)
            return tf.IndexedSlices(values, indices, dense_shape=local.dense_shape)
        return finish
