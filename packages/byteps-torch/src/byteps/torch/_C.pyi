"""Type stub for byteps.torch._C, the DLPack bridge (no libtorch inside).

dtype codes are byteps.common.dtypes.DType wire codes: float32 0, float64 1,
float16 2, bfloat16 3, int32 4, int64 5.
"""

from typing import Tuple

SUPPORTED_DTYPES: Tuple[str, ...]

class DLPackBuffer:
    """Owner of one DLManagedTensor; exports its bytes (format 'B', writable) and
    calls the producer's deleter when the last view is released. Made by from_dlpack only."""

    @property
    def nbytes(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...

def from_dlpack(capsule: object) -> Tuple[memoryview, int, Tuple[int, ...]]:
    """Consume a 'dltensor' capsule (tensor.__dlpack__()) of a contiguous CPU tensor.

    Returns (writable flat byte memoryview, byteps dtype code, shape). The capsule is
    renamed 'used_dltensor'; the memoryview keeps the tensor's memory alive.
    TypeError if ``capsule`` is not a capsule; ValueError for a used or versioned
    capsule, a non-CPU device (stage it to the CPU), an unsupported dtype, a
    non-contiguous tensor or a shape whose byte size overflows, in which cases the
    capsule stays unconsumed.
    """
