"""Type stub for byteps.common._C, the compiled reduction kernels.

dtype arguments are wire codes of byteps.common.dtypes.DType (0..5).
Buffers are any C-contiguous buffer-protocol object; destinations must be
writable. All functions release the GIL around their loop.
"""

from typing import Dict, Union

from typing_extensions import Buffer

KERNEL_ABI: int

def accumulate(acc: Buffer, src: Buffer, dtype: int, first: bool) -> None:
    """acc (accumulation type) = widen(src) if first else acc + widen(src)."""

def finalize(out: Buffer, acc: Buffer, dtype: int) -> None:
    """out (dtype) = narrow(acc); round to nearest even for float16/bfloat16."""

def sum_into(dst: Buffer, src: Buffer, dtype: int) -> None:
    """dst += src elementwise in dtype (halves through float32)."""

def scale(buf: Buffer, dtype: int, divisor: int) -> None:
    """buf /= divisor in place; floor division (numpy //) for integer dtypes."""

def scale_into(dst: Buffer, src: Buffer, dtype: int, divisor: int) -> None:
    """dst = src / divisor in one pass, rounded as scale; dst may be src itself,
    or must not overlap it."""

def itemsize(dtype: int) -> int: ...
def accumulation_itemsize(dtype: int) -> int: ...
def kernel_table() -> Dict[str, int]:
    """{'abi': 1, 'accumulate': address, 'finalize': address}: C function pointers

    void accumulate(void* acc, const void* src, size_t count, int dtype, int first);
    void finalize(void* out, const void* acc, size_t count, int dtype);
    """

def cpu_features() -> Dict[str, Union[bool, str]]:
    """{'avx2': bool, 'f16c': bool, 'avx512f': bool, 'isa': 'avx2+f16c' | 'portable'}"""

def _set_isa(name: str) -> str:
    """Testing hook: select 'portable' or 'avx2+f16c' kernels; returns the previous name."""
