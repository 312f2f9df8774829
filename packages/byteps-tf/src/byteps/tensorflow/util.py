"""Horovod's ``horovod.tensorflow.util`` helpers that scripts and Horovod's own tests call:
``hvd.util._executing_eagerly()``."""

from __future__ import annotations

import tensorflow as tf

__all__ = ["_executing_eagerly"]


def _executing_eagerly() -> bool:
    """Whether TensorFlow runs eagerly here (False in a TF1 graph and while tracing a tf.function)."""
    return tf.executing_eagerly()
