"""Type stub for byteps.common._C, the compiled reduction and compression kernels.

dtype arguments are wire codes of byteps.common.dtypes.DType (0..5); the
compression functions take FLOAT32 (0), FLOAT64 (1) and FLOAT16 (2) only
(ValueError naming any other). Buffers are any C-contiguous buffer-protocol
object; destinations must be writable. All functions release the GIL around
their loop.
"""

from typing import Dict, Optional, Union

import numpy as np
import numpy.typing as npt
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

# --- compression (csrc/compress_kernels.cpp; layouts in its header comment) -----------
# `state` is BytePS's xorshift128+ state: a writable uint64 array [a, b], seeded as
# [seed, seed], updated in place by every function that draws from it.
# `error` (every *_compress): error feedback's error = src - decompress(dst), written in the
# same pass, bit for bit what decompressing into it and np.subtract(src, error, out=error)
# give; src's element count, writable, overlapping neither dst nor state, but may be src itself.

def xorshift_next(state: npt.NDArray[np.uint64], count: int) -> npt.NDArray[np.uint64]:
    """The next count outputs of xorshift128+ (t=a; s=b; a=s; t^=t<<23; t^=t>>17; t^=s^(s>>26); b=t; t+s)."""

def onebit_compressed_nbytes(count: int, dtype: int) -> int:
    """ceil(count / (8*itemsize)) * itemsize + 4."""

def onebit_compress(src: Buffer, dst: Buffer, dtype: int, scaling: bool,
                    error: Optional[Buffer] = None) -> None:
    """dst = one sign bit per element (1 where x < 0; -0.0 and NaN give 0) in itemsize-wide
    little-endian words, first element in the most significant bit, then a float32 scale:
    1.0, or with scaling the mean |x| (summed in double)."""

def onebit_decompress(src: Buffer, dst: Buffer, dtype: int) -> None:
    """dst[i] = -scale where bit i is set, else +scale."""

def sparse_compressed_nbytes(k: int, dtype: int) -> int:
    """k * (4 + itemsize): k packed {uint32 index, value} records."""

def topk_compress(src: Buffer, dst: Buffer, dtype: int, k: int, error: Optional[Buffer] = None) -> None:
    """dst = records of the k (1 <= k <= n) elements of largest |x|, ties to the lower index,
    NaN above every number, in ascending index order."""

def randomk_compress(src: Buffer, dst: Buffer, dtype: int, k: int, state: npt.NDArray[np.uint64],
                     error: Optional[Buffer] = None) -> None:
    """dst = records of k >= 1 elements at index next() % n, in draw order, duplicates kept."""

def sparse_decompress(src: Buffer, dst: Buffer, dtype: int) -> None:
    """dst = 0, then dst[index] = value for each record in order (ValueError, dst untouched,
    for an index >= n)."""

def dithering_compressed_nbytes(count: int, levels: int) -> int:
    """ceil(count * (1 + bit_length(levels)) / 8) + 4; levels in 1..2**24."""

def dithering_compress(src: Buffer, dst: Buffer, dtype: int, levels: int, natural: bool, l2: bool,
                       state: npt.NDArray[np.uint64], error: Optional[Buffer] = None) -> None:
    """dst = each element stochastically rounded to one of the levels of max |x| (or the l2
    norm if l2), one draw per element: a (1 + bit_length(levels))-bit field per element
    (bit 0 sign, then the level code: q for linear, log2(q) + 1 for natural levels 2^j),
    packed least significant bit first, then the float32 scale. natural needs levels <= 31.
    A zero, Inf or NaN scale encodes every element as 0 (still drawing n times)."""

def dithering_decompress(src: Buffer, dst: Buffer, dtype: int, levels: int, natural: bool) -> None:
    """dst[i] = +-(q * scale / S) in float32, S = levels (linear) or 2**(levels-1) (natural)."""

def axpy(dst: Buffer, src: Buffer, dtype: int, alpha: float) -> None:
    """dst += float32(alpha) * src (float16 through float32, float64 in double); dst may be src."""

def nesterov(grad: Buffer, momentum: Buffer, dtype: int, mu: float) -> None:
    """momentum = grad + mu*momentum; grad = grad + mu*momentum, in place (mu a float32)."""
