"""Average a list of gradients over all workers, as one group of push_pulls.

Shared by :class:`~byteps.tensorflow.DistributedGradientTape`, the TF1 and
the Keras ``DistributedOptimizer``. Gradient *i* of the list is named
``"<prefix>.<i>"``: the list comes from the same code on every rank, so the
names agree without depending on variable names (which Keras makes unique
per process).

* ``None`` stays ``None`` and is not sent (as in Horovod): every rank must
  get ``None`` for the same sources, which the same model code ensures.
* ``tf.IndexedSlices`` (embedding gradients) are densified with
  ``sparse_as_dense=True``. Otherwise, where the job allows it (servers,
  ``Average`` or ``Sum``, every rank, no backup workers, synchronous
  training) and the values are float16/32/64 or bfloat16
  (:func:`byteps.tensorflow.row_sparse.takes_row_sparse`), they go through
  a row-sparse push_pull: the union of every worker's row ids, ascending,
  each with its rows summed (or averaged), as a ``tf.IndexedSlices`` of the
  same dense shape, the table named after the gradient's push_pull name.
  Elsewhere every rank's values and indices are gathered (duplicate
  indices add up when applied) and, for ``Average``, the values divided by
  the number of workers. Both are the same update as the dense average
  (docs/sparse.md).
* ``gradient_predivide_factor=f`` divides by ``f`` before the sum and
  multiplies by ``f / size()`` after (Horovod), for float16 range.
* With one worker nothing is sent (as in Horovod).
* ``op=Adasum`` (Horovod's): each dense gradient is combined by Adasum
  (:mod:`byteps.common.frontend.adasum`) instead of averaged, computed by
  every rank from all ranks' gradients (:class:`~byteps.tensorflow.reduction.AdasumReduce`),
  bit-identical on every rank. As in Horovod: floating-point gradients,
  a power-of-two number of ranks, ``tf.IndexedSlices`` only with
  ``sparse_as_dense=True``, no ``gradient_predivide_factor``;
  ``compression=Compression.fp16`` sends float16 and combines it in
  float32. Not with ``compression_params`` (BytePS's compressors compress
  the servers' sums, and Adasum is not a sum). A process set combines its
  ranks' gradients (Horovod refuses sets; here they work as for Average).
* ``process_set`` (Horovod's): the gradients are averaged over that set's
  ranks only, one push_pull each (fusion spans every rank); a rank outside
  the set, or alone in it, keeps its own gradients, as Horovod's wrappers
  do (``_allreduce_cond``). Sizes (``Average``, the predivide factor, local
  gradients' scaling) are the set's.
* Gradients of worker-local variables (``local``) are not sent; Horovod
  divides them by ``size()`` (``scale_local_gradients``) and so do we.
* Backup workers (BYTEPS_BACKUP_WORKERS, docs/async.md): each reduce
  remembers, per ``prefix``, which gradients it sent (their places,
  shapes and dtypes; at trace time inside a graph), and
  :meth:`GradientReducer.skip_round` replays that round eagerly inside
  ``worker.skipping_round()`` when this worker learnt that the round
  closed without it: the servers' averages of the round, nothing pushed.
  Only a plain average over every worker can be skipped (no predivide
  factor, ``compression_params``, process set, Adasum or sparse
  ``tf.IndexedSlices``): only such a round closes early.
* ``compression`` with a :class:`~byteps.tensorflow.gradient_compression.GradientCompression`
  (BytePS's ``compression_params``): each dense gradient large enough to be
  compressed is averaged, then compressed alone by the worker core (fused
  apart from the others), with the optimizer's learning rate. With ``"nesterov"``,
  ``tf.IndexedSlices`` are densified (the momentum is dense) and the
  gradients that went uncompressed get the momentum after the pull (all of
  them with one worker).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from byteps.common import api
from byteps.common.frontend import Average, check_gradient_op, is_initialized, size
from byteps.common.frontend.adasum import check_adasum
from byteps.common.frontend.collectives import RankView
from byteps.common.frontend.process_sets import global_process_set, rank_view
from byteps.common.frontend.reductions import Adasum
from byteps.tensorflow.compression import Compression
from byteps.tensorflow.gradient_compression import GradientCompression
from byteps.tensorflow.graph_ops import run_group, skipped_round_ops
from byteps.tensorflow.ops import check_process_set
from byteps.tensorflow.reduction import AdasumReduce, Gather, Reduce, RowSparse
from byteps.tensorflow.row_sparse import inputs as row_sparse_inputs
from byteps.tensorflow.row_sparse import takes_row_sparse

__all__ = ["GradientReducer", "SentRound", "last_round"]


@dataclasses.dataclass(frozen=True)
class SentRound:
    """What one reduce sent: for each gradient of the call, its (shape, dtype) if it went dense through the
    servers' average, else None; and whether the whole round can be skipped (see the module doc)."""

    layout: Tuple[Optional[Tuple[Tuple[int, ...], tf.DType]], ...]
    local: Optional[Tuple[bool, ...]]
    skippable: bool
    reducer: GradientReducer = dataclasses.field(compare=False, repr=False)

    def check_variables(self, variables: Sequence[Any], what: str) -> None:
        """``variables`` must be those the round's gradients were for: as many, the same shapes."""
        if len(variables) != len(self.layout):
            raise ValueError(f"{what}: the last round had {len(self.layout)} gradients, got {len(variables)} "
                             "variables: pass the variables whose gradients the tape computed, in that order")
        for i, (variable, spec) in enumerate(zip(variables, self.layout)):
            if spec is not None and tuple(variable.shape.as_list()) != spec[0]:
                raise ValueError(f"{what}: variable {i} ({getattr(variable, 'name', '?')}) has shape "
                                 f"{tuple(variable.shape.as_list())}, the round's gradient {i} had {spec[0]}: pass "
                                 "the variables whose gradients the tape computed, in that order")

    def skip(self) -> Optional[List[Optional[tf.Tensor]]]:
        """Backup workers, eagerly: :meth:`pull` if :meth:`behind`, else None (and nothing happens)."""
        if tf.inside_function() or not tf.executing_eagerly():
            raise RuntimeError("skip_step() runs eagerly, before the step: call it outside tf.function")
        return self.pull() if self.behind() else None

    def behind(self) -> bool:
        """Backup workers: whether this worker learnt that its next round closed without it.

        Every push_pull since the last call counts: the servers' answers said how many rounds had closed
        after them (``take_rounds_behind``, read and reset here). False for a round that cannot close early.
        """
        if not self.skippable or not api.is_initialized():
            return False
        return api.worker().take_rounds_behind() >= 1

    def pull(self) -> List[Optional[tf.Tensor]]:
        """That round's averages from the servers (pulled, nothing pushed), in the places of this round's
        gradients (None where it sent none). Eagerly the values (the skipping flag is this thread's); in a
        TF1 graph the outputs of an op that pulls when it runs, outside the graph's chain of byteps ops
        (:func:`byteps.tensorflow.graph_ops.skipped_round_ops`)."""
        zeros = [None if spec is None else tf.zeros(spec[0], spec[1]) for spec in self.layout]
        if tf.executing_eagerly():
            with api.worker().skipping_round():
                return self.reducer.reduce(zeros, self.local)
        with skipped_round_ops():
            return self.reducer.reduce(zeros, self.local)


def last_round(prefix: str) -> Optional[SentRound]:
    """The last round the reducers of ``prefix`` sent (None before the first)."""
    return _last_rounds.get(prefix)


#: The last round each prefix sent (tapes are made anew every step: the prefix is what lasts).
_last_rounds: Dict[str, SentRound] = {}


@dataclasses.dataclass
class GradientReducer:
    """How one wrapper reduces its gradients (checked at construction)."""

    prefix: str
    compression: Any = Compression.none
    sparse_as_dense: bool = False
    op: int = Average
    gradient_predivide_factor: float = 1.0
    compressed: Optional[GradientCompression] = None  # BytePS's compression_params, with its optimizer
    scale_local_gradients: bool = True  # divide local variables' gradients by size() (Horovod)
    process_set: Any = None  # Horovod's: reduce over these ranks only (None: every rank)

    def __post_init__(self) -> None:
        check_gradient_op(self.op, self.gradient_predivide_factor)
        if self.process_set is global_process_set:
            self.process_set = None
        if self.process_set is not None:
            check_process_set(self.process_set)
            if self.compressed is not None:
                raise ValueError("compression_params compress over every rank: drop process_set, or drop "
                                 "compression_params to average over the process set")
        if self.op == Adasum:
            if self.compressed is not None:
                raise ValueError("op=Adasum combines every rank's gradients, and compression_params compress the "
                                 "servers' sums: drop compression_params (compression=Compression.fp16 works)")
            if is_initialized():
                self.check_adasum_ranks()

    def check_adasum_ranks(self) -> None:
        """Horovod's limit: Adasum combines a power-of-two number of ranks (those of the process set)."""
        included, _ = self._members()
        if included:
            check_adasum(self.group_size(), np.float32, f"{self.prefix} with op=Adasum")

    def _members(self) -> Tuple[bool, Optional[RankView]]:
        """Whether this rank reduces, and over which process set's ranks (None: every rank)."""
        if self.process_set is None:
            return True, None
        if not self.process_set.included():
            return False, None
        return True, rank_view(self.process_set)  # fails, naming the set, once it was removed

    def group_size(self) -> int:
        """How many ranks the gradients are averaged over (this rank alone when outside the process set)."""
        included, view = self._members()
        return size() if view is None and included else (view.size if view is not None else 1)

    def reduce(self, gradients: Sequence[Optional[Any]], local: Optional[Sequence[bool]] = None) -> List[Optional[Any]]:
        """The reduced gradients, in order (eager or in a graph).

        ``local[i]`` marks gradient *i* as a worker-local variable's (Horovod's
        ``register_local_var``/``local_layers``): it is not sent, and with
        ``scale_local_gradients`` it is divided by ``size()``, as Horovod does.
        """
        gradients = list(gradients)
        _last_rounds[self.prefix] = self._round_of(gradients, local)
        if local is not None and any(local):
            if self.compressed is not None and self.compressed.momentum is not None:
                raise ValueError("local variables and compression_params with momentum cannot be combined: "
                                 "byteps applies that momentum to the gradients it sends only")
            shared = self.reduce([None if mine else g for g, mine in zip(gradients, local)])
            return [self._scaled_local(g) if mine else r for g, mine, r in zip(gradients, local, shared)]
        compressed = self.compressed
        momentum = compressed is not None and compressed.momentum is not None
        if momentum:
            gradients = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in gradients]
        included, view = self._members()
        group = self.group_size()
        if group == 1 or not included:
            return self._local_momentum(gradients) if momentum else gradients
        if self.op == Adasum:
            return self._adasum(gradients, view)
        average = self.op == Average
        predivide = self.gradient_predivide_factor
        specs, inputs, finishers = [], [], []
        for i, gradient in enumerate(gradients):
            if gradient is None:
                continue
            name = f"{self.prefix}.{i}"
            if isinstance(gradient, tf.IndexedSlices) and not self.sparse_as_dense \
                    and takes_row_sparse(gradient, self.op, self.process_set):
                specs.append(RowSparse(name, average=average))
                inputs.extend(row_sparse_inputs(gradient))
                finishers.append((i, self._row_sparse_finisher(gradient)))
                continue
            if isinstance(gradient, tf.IndexedSlices) and not self.sparse_as_dense:
                specs.append(Gather(name, parts=2, view=view))
                inputs.extend([gradient.values, gradient.indices])
                finishers.append((i, self._sparse_finisher(gradient, average, group)))
                continue
            dense = tf.convert_to_tensor(gradient)
            if average and predivide != 1.0:
                dense = dense / tf.cast(predivide, dense.dtype)
            sent, ctx = self.compression.compress(dense)
            specs.append(Reduce(name, average=average and predivide == 1.0,
                                compression=None if compressed is None else compressed.spec, view=view))
            inputs.append(sent)
            finishers.append((i, self._dense_finisher(ctx, predivide / group if average and predivide != 1.0
                                                      else 1.0)))
        lr = compressed.learning_rate_now() if compressed is not None and specs else None
        outputs = run_group(specs, inputs, lr)
        reduced: List[Optional[Any]] = [None] * len(gradients)
        position = 0
        for spec, (i, finish) in zip(specs, finishers):
            count = spec.outputs()
            reduced[i] = finish(outputs[position:position + count])
            position += count
        if momentum:  # every gradient is dense here: one Reduce and one input each
            indices = [i for i, _ in finishers]
            with_momentum = compressed.apply_momentum([spec.name for spec in specs], [reduced[i] for i in indices],
                                                      [sent.dtype.size for sent in inputs], True)
            for i, gradient in zip(indices, with_momentum):
                reduced[i] = gradient
        return reduced

    def _round_of(self, gradients: Sequence[Optional[Any]], local: Optional[Sequence[bool]]) -> SentRound:
        layout: List[Optional[Tuple[Tuple[int, ...], tf.DType]]] = []
        skippable = (self.op == Average and self.gradient_predivide_factor == 1.0 and self.compressed is None
                     and self.process_set is None and size() > 1)
        for i, gradient in enumerate(gradients):
            if gradient is None or (local is not None and local[i]):
                layout.append(None)
                continue
            if isinstance(gradient, tf.IndexedSlices) and not self.sparse_as_dense:
                skippable = False  # gathered or row-sparse: a round that waits for every rank
                layout.append(None)
                continue
            if isinstance(gradient, tf.IndexedSlices):  # sent dense (sparse_as_dense)
                static = tf.get_static_value(gradient.dense_shape)
                shape = tf.TensorShape(None if static is None else [int(d) for d in static])
            else:
                if not hasattr(gradient, "shape") or not hasattr(gradient, "dtype"):
                    gradient = tf.convert_to_tensor(gradient)  # what reduce() sends
                shape = tf.TensorShape(gradient.shape)
            if not shape.is_fully_defined():
                skippable = False
                layout.append(None)
                continue
            layout.append((tuple(shape.as_list()), tf.as_dtype(gradient.dtype)))
        return SentRound(tuple(layout), None if local is None else tuple(bool(m) for m in local), skippable, self)

    def skip_round(self) -> Optional[List[Optional[tf.Tensor]]]:
        """:meth:`SentRound.skip` of this reducer's prefix's last round (None before the first)."""
        sent = last_round(self.prefix)
        return None if sent is None else sent.skip()

    def _adasum(self, gradients: List[Optional[Any]], view: Optional[RankView]) -> List[Optional[Any]]:
        """Each dense gradient combined by Adasum over the ranks, all of them in one group."""
        self.check_adasum_ranks()
        specs, inputs, finishers = [], [], []
        for i, gradient in enumerate(gradients):
            if gradient is None:
                continue
            if isinstance(gradient, tf.IndexedSlices):
                if not self.sparse_as_dense:
                    raise NotImplementedError(f"{self.prefix}: op=Adasum combines dense gradients only, and gradient "
                                              f"{i} is a tf.IndexedSlices (as in Horovod): pass sparse_as_dense=True")
                gradient = tf.convert_to_tensor(gradient)
            sent, ctx = self.compression.compress(tf.convert_to_tensor(gradient))
            check_adasum(self.group_size(), sent.dtype.as_numpy_dtype if sent.dtype != tf.bfloat16 else np.float32,
                         f"{self.prefix}.{i} with op=Adasum")
            specs.append(AdasumReduce(f"{self.prefix}.{i}", view=view))
            inputs.append(sent)
            finishers.append((i, ctx))
        outputs = run_group(specs, inputs)
        reduced: List[Optional[Any]] = [None] * len(gradients)
        for output, (i, ctx) in zip(outputs, finishers):
            reduced[i] = self.compression.decompress(output, ctx)
        return reduced

    def _scaled_local(self, gradient: Optional[Any]) -> Optional[Any]:
        # Horovod divides by the set's size, on ranks outside the set too.
        group = size() if self.process_set is None else len(self.process_set.ranks)
        if gradient is None or not self.scale_local_gradients or group == 1:
            return gradient
        if isinstance(gradient, tf.IndexedSlices):
            return tf.IndexedSlices(gradient.values / tf.cast(group, gradient.values.dtype), gradient.indices,
                                    gradient.dense_shape)
        return gradient / tf.cast(group, gradient.dtype)

    def _local_momentum(self, gradients: List[Optional[Any]]) -> List[Optional[Any]]:
        """One worker: nothing is sent, but the momentum (turned off in the optimizer) is still byteps' to apply."""
        present = [i for i, g in enumerate(gradients) if g is not None]
        with_momentum = self.compressed.apply_momentum([f"{self.prefix}.{i}" for i in present],
                                                       [gradients[i] for i in present],
                                                       [gradients[i].dtype.size for i in present], False)
        for i, gradient in zip(present, with_momentum):
            gradients[i] = gradient
        return gradients

    def _dense_finisher(self, ctx: Any, postscale: float):
        def finish(outputs: List[tf.Tensor]) -> tf.Tensor:
            result = self.compression.decompress(outputs[0], ctx)
            return result * tf.cast(postscale, result.dtype) if postscale != 1.0 else result
        return finish

    @staticmethod
    def _row_sparse_finisher(local: tf.IndexedSlices):
        def finish(outputs: List[tf.Tensor]) -> tf.IndexedSlices:
            return tf.IndexedSlices(outputs[0], outputs[1], dense_shape=local.dense_shape)
        return finish

    @staticmethod
    def _sparse_finisher(local: tf.IndexedSlices, average: bool, group: int):
        def finish(outputs: List[tf.Tensor]) -> tf.IndexedSlices:
            values, indices = outputs[0], outputs[1]
            if average:
                values = values / tf.cast(group, values.dtype)
            return tf.IndexedSlices(values, indices, dense_shape=local.dense_shape)
        return finish
