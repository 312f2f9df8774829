"""Reduction kernels: sum, widen/narrow and average raw gradient buffers.

A thin front over the compiled ``byteps.common._C``. Every function takes
buffers (numpy arrays, memoryviews, ``bytes`` for inputs, received payloads),
reads them as ``dtype`` whatever their own format is, works in place, and
releases the GIL while it loops. ``dtype`` is a :class:`DType` or anything
:func:`~byteps.common.dtypes.dtype_of` accepts (``"float16"``, ``np.float32``).

float16 and bfloat16 are summed in float32: ``accumulate`` widens into a
float32 accumulator and ``finalize`` rounds back once, to nearest even.

Example: the server's path for three workers' float16 pushes::

    acc = empty_accumulator(n, DType.FLOAT16)
    accumulate(acc, push0, DType.FLOAT16, first=True)
    accumulate(acc, push1, DType.FLOAT16)
    accumulate(acc, push2, DType.FLOAT16)
    finalize(out, acc, DType.FLOAT16)        # out: n float16
    scale(out, DType.FLOAT16, 3)             # the average

``scale_into(out, summed, dtype, n)`` writes the average to another buffer in
one pass instead. Raises ValueError when sizes disagree, a destination is
read-only, buffers partly overlap, or the dtype is unknown.
"""

from __future__ import annotations

from typing import Any, Dict

import numpy as np

from byteps.common import _C
from byteps.common.dtypes import DType, dtype_of

__all__ = [
    "accumulate",
    "finalize",
    "sum_into",
    "scale",
    "scale_into",
    "empty_accumulator",
    "kernel_table",
    "cpu_features",
]

Buffer = Any  # anything with the buffer protocol


def accumulate(acc: Buffer, src: Buffer, dtype: Any, first: bool = False) -> None:
    """``acc = widen(src)`` if ``first`` else ``acc += widen(src)``.

    ``acc`` holds as many elements as ``src``, in the accumulation type
    (float32 for float16/bfloat16, ``dtype`` otherwise).
    """
    _C.accumulate(acc, src, int(dtype_of(dtype)), bool(first))


def finalize(out: Buffer, acc: Buffer, dtype: Any) -> None:
    """``out = narrow(acc)``: round float32 to float16/bfloat16 (nearest even), else copy."""
    _C.finalize(out, acc, int(dtype_of(dtype)))


def sum_into(dst: Buffer, src: Buffer, dtype: Any) -> None:
    """``dst += src`` elementwise in ``dtype`` (halves through float32, rounded once)."""
    _C.sum_into(dst, src, int(dtype_of(dtype)))


def scale(buf: Buffer, dtype: Any, divisor: int) -> None:
    """``buf /= divisor`` in place; integers use floor division like numpy's ``//``."""
    _C.scale(buf, int(dtype_of(dtype)), int(divisor))


def scale_into(dst: Buffer, src: Buffer, dtype: Any, divisor: int) -> None:
    """``dst = src / divisor`` in one pass, with :func:`scale`'s rounding and floor division.

    Saves the copy in front of an in-place :func:`scale`, e.g. averaging a
    received sum straight into the caller's tensor::

        scale_into(tensor, frame, DType.FLOAT32, num_workers)

    ``dst`` may be ``src`` itself; any other overlap is a ValueError.
    """
    _C.scale_into(dst, src, int(dtype_of(dtype)), int(divisor))


def empty_accumulator(count: int, dtype: Any) -> np.ndarray:
    """An uninitialised accumulator for ``count`` elements of ``dtype``.

    >>> empty_accumulator(4, "float16").dtype
    dtype('float32')
    """
    found = dtype_of(dtype)
    storage = np.float32 if found in (DType.FLOAT16, DType.BFLOAT16) else found.storage
    return np.empty(count, dtype=storage)


def kernel_table() -> Dict[str, int]:
    """C entry points ``{"abi", "accumulate", "finalize"}`` for byteps-server's engine."""
    return _C.kernel_table()


def cpu_features() -> Dict[str, Any]:
    """Detected CPU features and the instruction set in use, e.g. ``{"avx2": True, "isa": "avx2+f16c"}``."""
    return _C.cpu_features()
