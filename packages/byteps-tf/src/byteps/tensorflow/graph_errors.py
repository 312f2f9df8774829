"""Errors of byteps ops inside graphs keep their TensorFlow class.

Inside ``tf.function`` and TF1 graphs a byteps op is a ``tf.py_function``,
and TensorFlow turns every Python exception in it (but ValueError, TypeError
and NotImplementedError) into ``UnknownError``. Horovod raises
``FailedPreconditionError`` when ranks disagree, and scripts catch that class.
So the body of the py_function returns a ``tf.errors.OpError`` as data, an
error code and its message, and ``BytepsForwardOrFail`` (a small op written
against TensorFlow's C API, ``csrc/graph_error_op.cpp``) placed after it
fails with that very code and message, or forwards the results.

The op library links nothing of TensorFlow: it looks TensorFlow's C API up in
the running process. Where it cannot be loaded (a TensorFlow without that C
API), :func:`available` is False, the reason is logged once, and errors fall
back to the py_function's ``UnknownError`` (whose message still starts with
the byteps error).
"""

from __future__ import annotations

import logging
import pathlib
from typing import Any, Callable, List, Optional, Sequence

import tensorflow as tf

__all__ = ["available", "guard", "forward_or_fail"]

log = logging.getLogger("byteps.tensorflow")

_LIBRARY = pathlib.Path(__file__).with_name("_graph_error_op.so")
_OK = 0
_op: Optional[Callable[..., Any]] = None
_tried = False


def _load() -> Optional[Callable[..., Any]]:
    global _op, _tried
    if not _tried:
        _tried = True
        try:
            module = tf.load_op_library(str(_LIBRARY))
            _op = module.byteps_forward_or_fail
        except (tf.errors.NotFoundError, AttributeError, OSError) as exc:
            log.warning("byteps errors inside graphs will be UnknownError: cannot load %s (%s)", _LIBRARY, exc)
    return _op


def available() -> bool:
    """True when errors inside graphs can keep their class."""
    return _load() is not None


def _empty(dtype: tf.DType) -> tf.Tensor:
    return tf.constant([], dtype=dtype)


def guard(body: Callable[..., Sequence[tf.Tensor]], dtypes: Sequence[tf.DType]) -> Callable[..., List[tf.Tensor]]:
    """``body`` for a py_function, returning ``[*outputs, code, message]``: an OpError becomes data.

    Only ``tf.errors.OpError`` (byteps' MismatchError and InvalidArgument are
    ones) is turned into data; anything else propagates as before.
    """

    def guarded(*inputs: tf.Tensor) -> List[tf.Tensor]:
        try:
            outputs = list(body(*inputs))
        except tf.errors.OpError as exc:
            message = (exc.message or type(exc).__name__).encode("utf-8", "replace")
            return [*(_empty(dtype) for dtype in dtypes), tf.constant(exc.error_code, tf.int32),
                    tf.constant(list(message), tf.uint8, shape=[len(message)])]
        return [*outputs, tf.constant(_OK, tf.int32), _empty(tf.uint8)]

    return guarded


def forward_or_fail(outputs: Sequence[tf.Tensor]) -> List[tf.Tensor]:
    """``outputs`` of a guarded py_function less its code and message; fails the graph with them when set."""
    *values, code, message = outputs
    code.set_shape([])
    message.set_shape([None])
    return list(_load()(code=code, message=message, values=values))


@tf.RegisterGradient("BytepsForwardOrFail")
def _forward_gradients(op: tf.Operation, *upstream: Any) -> List[Any]:
    return [None, None, *upstream]
