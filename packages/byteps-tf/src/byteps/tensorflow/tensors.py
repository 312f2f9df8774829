"""tf.Tensor to byteps buffer and back: dtypes, DLPack views, result buffers.

byteps-common reduces numpy arrays. An eager CPU tensor is handed over
without a copy: its DLPack capsule goes through the compiled bridge
(``_C.from_dlpack``), which returns a memoryview over TensorFlow's own bytes.
The result goes into a ``_C.HostBuffer`` (64-byte aligned) that TensorFlow
then adopts through DLPack, again without a copy. ``tensor.numpy()`` and
``tf.convert_to_tensor(array)`` would each copy the whole tensor.

A tensor on another device (GPU) is copied to the CPU first and the result
copied back; that path is written but unverified (no GPU on the build machine).

Example::

    source = host_view(tensor)                  # numpy view of the tensor's bytes
    out = ResultBuffer.like(source)
    ... byteps writes into out.array ...
    result = out.to_tensor()                    # a tf.Tensor over the same memory
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Tuple

import numpy as np
import tensorflow as tf

from byteps.common.dtypes import DType
from byteps.common.frontend.binding import dtype_table
from byteps.common.frontend.collectives import Piece
from byteps.tensorflow import _C

__all__ = ["byteps_dtype", "HostView", "host_view", "ResultBuffer", "widen", "SUPPORTED", "to_piece", "from_piece"]

_DTYPES = dtype_table(lambda name: getattr(tf, name))
SUPPORTED = ", ".join(dtype.name for dtype in _DTYPES)

# Integer and boolean dtypes byteps does not reduce, with an exact wider
# stand-in; broadcasts (which only add zeros to the root's values) use it.
_WIDER = {tf.bool: tf.int32, tf.int8: tf.int32, tf.uint8: tf.int32, tf.int16: tf.int32, tf.uint16: tf.int32,
          tf.uint32: tf.int64}


def byteps_dtype(dtype: tf.DType, what: str) -> DType:
    """The byteps DType of a TensorFlow dtype; ValueError naming the supported ones."""
    found = _DTYPES.get(tf.as_dtype(dtype))
    if found is None:
        raise ValueError(f"{what}: unsupported dtype {tf.as_dtype(dtype).name}; byteps reduces {SUPPORTED}")
    return found


def widen(dtype: tf.DType) -> tf.DType:
    """The dtype a broadcast sends ``dtype`` as (itself when byteps reduces it)."""
    return _WIDER.get(tf.as_dtype(dtype), tf.as_dtype(dtype))


@functools.lru_cache(maxsize=64)
def _is_cpu_device(device: str) -> bool:
    return not device or tf.DeviceSpec.from_string(device).device_type in (None, "CPU")


def _on_cpu(tensor: tf.Tensor) -> bool:
    return _is_cpu_device(getattr(tensor, "device", "") or "")


@dataclasses.dataclass
class HostView:
    """A tensor's bytes where byteps can read them: ``array`` is a flat numpy view."""

    array: np.ndarray
    dtype: DType
    shape: Tuple[int, ...]
    device: str  # where the result goes back to ("" for the CPU)

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)


def host_view(tensor: tf.Tensor, what: str) -> HostView:
    """View an eager tensor's bytes without a copy (after a device-to-host copy for GPU tensors)."""
    dtype = byteps_dtype(tensor.dtype, what)
    device = ""
    if not _on_cpu(tensor):
        device = tensor.device
        with tf.device("/CPU:0"):
            tensor = tf.identity(tensor)
    view, code, shape = _C.from_dlpack(tf.experimental.dlpack.to_dlpack(tensor))
    assert code == int(dtype), (code, dtype)
    return HostView(np.frombuffer(view, dtype=dtype.storage), dtype, tuple(shape), device)


@dataclasses.dataclass
class ResultBuffer:
    """Aligned host memory for a result, handed to TensorFlow without a copy."""

    buffer: _C.HostBuffer
    array: np.ndarray  # flat view in the dtype's storage type
    dtype: DType

    @classmethod
    def empty(cls, dtype: DType, elements: int, zero: bool = False) -> ResultBuffer:
        buffer = _C.HostBuffer(elements * dtype.itemsize, zero)
        return cls(buffer, np.frombuffer(buffer, dtype=dtype.storage), dtype)

    @classmethod
    def like(cls, view: HostView, zero: bool = False) -> ResultBuffer:
        return cls.empty(view.dtype, view.array.size, zero)

    def to_tensor(self, shape: Tuple[int, ...], device: str = "") -> tf.Tensor:
        """The first prod(shape) elements as a tf.Tensor sharing this memory (copied to ``device`` if given)."""
        tensor = tf.experimental.dlpack.from_dlpack(self.buffer.to_dlpack(int(self.dtype), list(shape)))
        if device:
            with tf.device(device):
                tensor = tf.identity(tensor)
        return tensor


def to_piece(tensor: tf.Tensor) -> Piece:
    """An eager tensor's bytes (a host copy), shape and dtype name, for the front's collectives (any dtype)."""
    if tensor.dtype == tf.string:
        raise ValueError("string tensors cannot be gathered or scattered: their elements have no fixed size")
    array = np.ascontiguousarray(tensor.numpy())
    raw = array.reshape(-1).view(np.uint8) if array.size else np.empty(0, np.uint8)
    return Piece(raw, tuple(int(d) for d in array.shape), tensor.dtype.name)


def from_piece(piece: Piece, dtype: tf.DType, device: str = "") -> tf.Tensor:
    """A new tensor of ``dtype`` from a piece's bytes (on ``device`` if given): TensorFlow's one copy."""
    array = np.frombuffer(piece.data, dtype=tf.as_dtype(dtype).as_numpy_dtype).reshape(piece.shape)
    with tf.device(device or "/CPU:0"):
        return tf.convert_to_tensor(array, dtype=dtype)
