"""Run a group of reductions eagerly, or as one ``tf.py_function`` inside a graph.

Inside ``tf.function`` (or a TF1 graph) a group becomes one ``EagerPyFunc``
op whose body is :func:`byteps.tensorflow.reduction.execute`: the group is
still pipelined inside byteps, and TensorFlow sees one op per group, not per
tensor. Dtypes are checked while tracing, so an unsupported dtype is a
ValueError at the call site.

Ordering: byteps gives tensors ids in order of first use and every rank must
issue the same ops, so the ops of one graph run in the order they were
created (each depends on the previous one). ``tf.function`` already orders
stateful ops this way; the explicit dependency also covers TF1 graphs.

A custom TensorFlow op would avoid the Python call per group; it is not
built, so that the package never links TensorFlow's C++ ABI (see
docs/tensorflow.md). ``py_function`` cannot be compiled by XLA: functions
using byteps need ``jit_compile=False``.

Errors: a ``tf.errors.OpError`` raised in the body (ranks that disagree)
keeps its class in the graph: the body returns it as data and the op of
:mod:`byteps.tensorflow.graph_errors` (TensorFlow's C API only) raises it.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Callable, Iterator, List, Optional, Sequence

import tensorflow as tf

from byteps.common import api
from byteps.tensorflow import graph_errors
from byteps.tensorflow.reduction import Gather, Reduce, RowSparse, Spec, execute
from byteps.tensorflow.tensors import byteps_dtype

__all__ = ["run_group", "run_eagerly", "skipped_round_ops"]

_last_op: weakref.WeakKeyDictionary[object, tf.Operation] = weakref.WeakKeyDictionary()
_skipped_round = [False]  # inside skipped_round_ops()


@contextlib.contextmanager
def skipped_round_ops() -> Iterator[None]:
    """Backup workers in a TF1 graph: the byteps ops made inside pull a closed round without pushing (their
    body runs in ``worker.skipping_round()``, on whichever thread TensorFlow runs it) and stay out of the
    graph's chain of byteps ops, in both directions: they run only when this worker skips a step, and the
    training op must neither run them nor be run by them."""
    _skipped_round[0] = True
    try:
        yield
    finally:
        _skipped_round[0] = False


def _static_shapes(specs: Sequence[Spec], inputs: Sequence[tf.Tensor]) -> List[tf.TensorShape]:
    shapes, position = [], 0
    for spec in specs:
        if isinstance(spec, RowSparse):  # the union's rows and ids: as many as the union has
            values = inputs[position]
            shapes.append(tf.TensorShape([None]).concatenate(values.shape[1:]) if values.shape.rank
                          else tf.TensorShape(None))
            shapes.append(tf.TensorShape([None]))
        elif not isinstance(spec, Gather):  # a Reduce or an AdasumReduce: the input's shape
            shapes.append(inputs[position].shape)
        else:
            for tensor in inputs[position:position + spec.parts]:
                shapes.append(tf.TensorShape([None]).concatenate(tensor.shape[1:]) if tensor.shape.rank
                              else tf.TensorShape(None))
            shapes.append(tf.TensorShape([None]))  # the row counts, one per rank
        position += spec.inputs
    return shapes


def _output_dtypes(specs: Sequence[Spec], inputs: Sequence[tf.Tensor]) -> List[tf.DType]:
    dtypes, position = [], 0
    for spec in specs:
        if isinstance(spec, RowSparse):  # rows and ids in the values' and indices' dtypes
            dtypes.extend([inputs[position].dtype, inputs[position + 1].dtype])
            position += spec.inputs
            continue
        dtypes.extend(tensor.dtype for tensor in inputs[position:position + spec.inputs])
        if isinstance(spec, Gather):
            dtypes.append(tf.int64)
        position += spec.inputs
    return dtypes


def run_group(specs: Sequence[Spec], inputs: Sequence[tf.Tensor], lr: Optional[tf.Tensor] = None) -> List[tf.Tensor]:
    """Outputs of every spec, flattened in order; eager or graph, whichever is current.

    ``lr`` (a scalar, the optimizer's learning rate now, or None) goes with
    compressed specs; in a graph it is one more input of the op, so its
    value is the one of the step that runs, schedules included.
    """
    inputs = [tf.convert_to_tensor(tensor) for tensor in inputs]
    if not specs:
        return []
    if tf.executing_eagerly():
        return execute(specs, inputs, None if lr is None else float(lr))
    position = 0
    for spec in specs:  # at trace time: the error points at the user's call (a gather moves any dtype)
        for tensor in inputs[position:position + spec.inputs] if isinstance(spec, Reduce) else ():
            byteps_dtype(tensor.dtype, f"push_pull({spec.name!r})")
        position += spec.inputs
    specs = list(specs)
    dtypes, shapes = _output_dtypes(specs, inputs), _static_shapes(specs, inputs)
    if lr is None:
        def body(*eager_inputs: tf.Tensor) -> List[tf.Tensor]:
            return execute(specs, eager_inputs)

        return run_eagerly(body, inputs, dtypes, shapes)

    def body_with_lr(*eager_inputs: tf.Tensor) -> List[tf.Tensor]:
        return execute(specs, eager_inputs[:-1], float(eager_inputs[-1]))

    return run_eagerly(body_with_lr, [*inputs, tf.cast(lr, tf.float64)], dtypes, shapes)


def run_eagerly(body: Callable[..., List[tf.Tensor]], inputs: Sequence[tf.Tensor], dtypes: Sequence[tf.DType],
                shapes: Optional[Sequence[tf.TensorShape]] = None) -> List[tf.Tensor]:
    """``body(*inputs)`` now when eager; in a graph, one ``py_function`` op ordered after the previous one."""
    inputs = [tf.convert_to_tensor(tensor) for tensor in inputs]
    if tf.executing_eagerly():
        return list(body(*inputs))
    graph = tf.compat.v1.get_default_graph()
    skipping = _skipped_round[0]
    previous = None if skipping else _last_op.get(graph)
    if skipping:
        body = _skipping(body)
    keep_error_class = graph_errors.available()
    if keep_error_class:
        body, dtypes = graph_errors.guard(body, dtypes), [*dtypes, tf.int32, tf.uint8]
    with tf.control_dependencies([previous] if previous is not None else []):
        outputs = tf.py_function(body, inputs, list(dtypes),
                                 name="BytePSSkippedRound" if skipping else "BytePSPushPull")
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    if not skipping:
        _last_op[graph] = outputs[0].op
    if keep_error_class:
        outputs = graph_errors.forward_or_fail(outputs)
    for output, shape in zip(outputs, shapes or [None] * len(outputs)):
        if shape is not None:
            output.set_shape(shape)
    return outputs


def _skipping(body: Callable[..., List[tf.Tensor]]) -> Callable[..., List[tf.Tensor]]:
    def pull_only(*inputs: tf.Tensor) -> List[tf.Tensor]:
        with api.worker().skipping_round():
            return body(*inputs)
    return pull_only
