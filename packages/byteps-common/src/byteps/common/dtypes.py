"""The element types byteps reduces, and their wire codes.

The code of a dtype travels in every frame header and indexes the C++
kernels, so the numbering is part of the wire protocol: never renumber.
float16 and bfloat16 are summed in float32 (their accumulation type).
numpy has no bfloat16: it is recognised from ml_dtypes' ``bfloat16`` dtype
when that is installed, or given explicitly as ``dtype="bfloat16"`` over
16-bit integer storage.
"""

from __future__ import annotations

import enum
from typing import Dict, Union

import numpy as np

__all__ = ["DType", "dtype_of"]


class DType(enum.IntEnum):
    FLOAT32 = 0
    FLOAT64 = 1
    FLOAT16 = 2
    BFLOAT16 = 3
    INT32 = 4
    INT64 = 5

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def is_integer(self) -> bool:
        return self in (DType.INT32, DType.INT64)

    @property
    def storage(self) -> np.dtype:
        """A numpy dtype with this dtype's byte layout (uint16 for bfloat16)."""
        return np.dtype(_STORAGE[self])

    @property
    def accumulation_itemsize(self) -> int:
        """Bytes per element of the buffer the server sums into."""
        return 4 if self in (DType.FLOAT16, DType.BFLOAT16) else self.itemsize


_ITEMSIZE = {
    DType.FLOAT32: 4,
    DType.FLOAT64: 8,
    DType.FLOAT16: 2,
    DType.BFLOAT16: 2,
    DType.INT32: 4,
    DType.INT64: 8,
}
_STORAGE = {
    DType.FLOAT32: "float32",
    DType.FLOAT64: "float64",
    DType.FLOAT16: "float16",
    DType.BFLOAT16: "uint16",
    DType.INT32: "int32",
    DType.INT64: "int64",
}
_BY_NAME = {member.name.lower(): member for member in DType}
# numpy dtypes already mapped: np.dtype.name costs ~2 us, paid per tensor of a
# grouped push_pull of hundreds of small tensors otherwise.
_BY_NUMPY: Dict[np.dtype, DType] = {}


def dtype_of(spec: Union[str, np.dtype, DType, type]) -> DType:
    """Map a dtype name, numpy dtype or DType to a DType; ValueError if unsupported.

    >>> dtype_of("float16")
    <DType.FLOAT16: 2>
    """
    if isinstance(spec, DType):
        return spec
    if isinstance(spec, np.dtype):
        known = _BY_NUMPY.get(spec)
        if known is not None:
            return known
    if isinstance(spec, str):
        name = spec.lower()
    else:
        try:
            name = np.dtype(spec).name
        except TypeError:
            name = str(spec)
    found = _BY_NAME.get(name)
    if found is None:
        supported = ", ".join(_BY_NAME)
        raise ValueError(f"unsupported dtype {name!r}: byteps reduces {supported}")
    if isinstance(spec, np.dtype):
        _BY_NUMPY[spec] = found
    return found
