"""NDArrays as byteps sees them: dtype mapping, checks, and the arrays an op needs.

byteps reduces float16, float32, float64, int32 and int64 (MXNet 1.x has no
bfloat16 NDArray). Dense CPU arrays are handed to byteps in place, through
DLPack, by the engine bridge (:mod:`byteps.mxnet.engine`); arrays on a GPU are
staged through a CPU copy made and copied back by MXNet's engine (written for
CUDA builds of MXNet, **unverified**: there was no GPU where this was built).
``mx.np.ndarray`` (MXNet's numpy interface) works as ``mx.nd.NDArray`` does.

Example::

    dtype = check_array(x, "push_pull('x')")    # DType.FLOAT32, or ValueError
    out = empty_like(x)                          # same class, shape, dtype and context
"""

from __future__ import annotations

import mxnet as mx
import numpy as np

from byteps.common.dtypes import DType

__all__ = ["check_array", "dtype_name", "empty_like", "zeros_like", "on_host", "scaled", "scale_", "NARROW_INTEGERS"]

_DTYPES = {
    "float16": DType.FLOAT16,
    "float32": DType.FLOAT32,
    "float64": DType.FLOAT64,
    "int32": DType.INT32,
    "int64": DType.INT64,
}
_SUPPORTED = ", ".join(_DTYPES)
_HOST_DEVICES = ("cpu", "cpu_pinned", "cpu_shared")

#: dtypes byteps does not reduce but broadcasts through an int32 copy (exact: only zeros are added).
NARROW_INTEGERS = ("bool", "uint8", "int8", "int16")


def dtype_name(array: mx.nd.NDArray) -> str:
    return np.dtype(array.dtype).name


def check_array(array: mx.nd.NDArray, what: str) -> DType:
    """The byteps DType of a dense NDArray; TypeError/ValueError saying what is wrong otherwise."""
    if not isinstance(array, mx.nd.NDArray):
        raise TypeError(f"{what}: expected an mxnet NDArray, got {type(array).__name__}")
    if array.stype != "default":
        raise ValueError(f"{what}: {array.stype} arrays are not supported; pass a dense array "
                         "(array.tostype('default'))")
    name = dtype_name(array)
    found = _DTYPES.get(name)
    if found is None:
        raise ValueError(f"{what}: unsupported dtype {name}; byteps reduces {_SUPPORTED}")
    return found


def on_host(array: mx.nd.NDArray) -> bool:
    """Whether byteps can read the array's memory directly (CPU, pinned or shared memory)."""
    return array.context.device_type in _HOST_DEVICES


def _is_numpy_interface(array: mx.nd.NDArray) -> bool:
    return isinstance(array, mx.np.ndarray)


def empty_like(array: mx.nd.NDArray) -> mx.nd.NDArray:
    """An uninitialised array of the same class, shape, dtype and context."""
    if _is_numpy_interface(array):
        return mx.np.empty(array.shape, dtype=array.dtype, ctx=array.context)
    return mx.nd.empty(array.shape, ctx=array.context, dtype=array.dtype)


def zeros_like(array: mx.nd.NDArray) -> mx.nd.NDArray:
    """Zeros of the same class, shape, dtype and context (an engine op)."""
    if _is_numpy_interface(array):
        return mx.np.zeros_like(array)
    return mx.nd.zeros_like(array)


def scaled(array: mx.nd.NDArray, factor: float) -> mx.nd.NDArray:
    """``array * factor`` in ``array``'s dtype, as Horovod scales: integers in float64 (truncated toward
    zero), float16 in float32. The same array when ``factor`` is 1 (engine ops otherwise)."""
    if factor == 1.0:
        return array
    name = dtype_name(array)
    if name in ("float32", "float64"):
        return array * factor
    wide = "float32" if name == "float16" else "float64"
    return (array.astype(wide) * factor).astype(name)


def scale_(array: mx.nd.NDArray, factor: float) -> None:
    """``array`` times ``factor`` in place, scaled as :func:`scaled` does."""
    if factor == 1.0:
        return
    if dtype_name(array) in ("float32", "float64"):
        array *= factor
    else:
        scaled(array, factor).copyto(array)
