"""Turn what a user hands us into a flat byte view of known dtype.

Accepted: numpy arrays, anything with the buffer protocol (memoryview,
bytearray, array.array) and anything exporting DLPack on the CPU
(``__dlpack__``). The bytes are never copied: push_pull reads the input in
place and writes the result in place. Non-contiguous memory and unsupported
dtypes are ValueErrors that say what to do.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple, Union

import numpy as np

from byteps.common.dtypes import DType, dtype_of

__all__ = ["TensorView", "as_tensor_view", "input_and_output_views"]


@dataclasses.dataclass(frozen=True)
class TensorView:
    """A contiguous tensor seen as bytes, with its element type."""

    array: np.ndarray  # the caller's array (same memory as ``data``)
    data: np.ndarray  # flat uint8 view of the same memory
    dtype: DType

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    @property
    def shape(self) -> tuple:
        return tuple(self.array.shape)


def _to_numpy(obj: Any, what: str) -> np.ndarray:
    if isinstance(obj, np.ndarray):
        return obj
    if hasattr(obj, "__dlpack__"):
        try:
            return np.from_dlpack(obj)
        except (BufferError, TypeError, RuntimeError) as exc:
            raise ValueError(
                f"{what}: cannot read it through DLPack ({exc}); byteps-common takes CPU memory: "
                "move the tensor to the CPU, or use a framework adapter (byteps.torch) for GPU tensors"
            ) from None
    try:
        return np.asarray(memoryview(obj))
    except TypeError:
        raise ValueError(
            f"{what}: {type(obj).__name__} is neither a numpy array, a buffer nor a DLPack tensor"
        ) from None


def as_tensor_view(obj: Any, what: str, dtype: Optional[Union[str, DType]] = None,
                   writable: bool = False) -> TensorView:
    """View ``obj`` as contiguous bytes; ``dtype`` overrides the element type.

    ``dtype="bfloat16"`` lets numpy users pass bfloat16 data stored in a
    16-bit integer array.
    """
    array = _to_numpy(obj, what)
    if not array.flags.c_contiguous:
        raise ValueError(
            f"{what}: the tensor is not contiguous (strides {array.strides}); pass a contiguous copy, "
            "e.g. numpy.ascontiguousarray(x)"
        )
    if writable and not array.flags.writeable:
        raise ValueError(f"{what}: the tensor is read-only but push_pull must write the result into it")
    if dtype is None:
        element = dtype_of(array.dtype)
    else:
        element = dtype_of(dtype)
        if array.dtype.itemsize != element.itemsize:
            raise ValueError(
                f"{what}: dtype={element.name.lower()} needs {element.itemsize}-byte elements, "
                f"the tensor has {array.dtype.itemsize}-byte {array.dtype.name}"
            )
    data = array.reshape(-1).view(np.uint8)
    return TensorView(array=array, data=data, dtype=element)


def input_and_output_views(tensor: Any, output: Any, what: str,
                           dtype: Optional[Union[str, DType]] = None) -> Tuple[TensorView, TensorView]:
    """The (input, output) views of one push_pull; ``output`` None means in place.

    ``what`` names the call in errors, e.g. ``push_pull('w')``. The output
    must have the input's size and element type.
    """
    source = as_tensor_view(tensor, f"{what} input", dtype, writable=output is None)
    target = source if output is None else as_tensor_view(output, f"{what} output", dtype, writable=True)
    if target.nbytes != source.nbytes or target.dtype != source.dtype:
        raise ValueError(
            f"{what}: output has {target.nbytes} bytes of {target.dtype.name.lower()}, "
            f"input has {source.nbytes} bytes of {source.dtype.name.lower()}")
    return source, target
