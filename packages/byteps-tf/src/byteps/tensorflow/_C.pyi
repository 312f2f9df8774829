"""Type stub for byteps.tensorflow._C, the DLPack bridge (no TensorFlow inside).

dtype codes are byteps.common.dtypes.DType wire codes: float32 0, float64 1,
float16 2, bfloat16 3, int32 4, int64 5.
"""

from typing import Sequence, Tuple

SUPPORTED_DTYPES: Tuple[str, ...]
ALIGNMENT: int

class ImportedTensor:
    """Owner of one consumed DLManagedTensor; exports its bytes (format 'B') and calls the
    producer's deleter when the last view is released. Made by from_dlpack only."""

    @property
    def nbytes(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...

def from_dlpack(capsule: object) -> Tuple[memoryview, int, Tuple[int, ...]]:
    """Consume a 'dltensor' capsule (tf.experimental.dlpack.to_dlpack(t)) of a contiguous CPU tensor.

    Returns (flat byte memoryview, byteps dtype code, shape). The capsule is renamed
    'used_dltensor'; the memoryview keeps the tensor's memory alive. TypeError if
    ``capsule`` is not a capsule; ValueError for a used or versioned capsule, a non-CPU
    device, an unsupported dtype, a non-contiguous tensor or a shape whose byte size overflows
    (the capsule then stays unconsumed).
    """

class HostBuffer:
    """64-byte aligned host memory that byteps writes a result into and TensorFlow adopts
    through DLPack without a copy. The memory lives until this object, every view of it and
    every tensor made from it are gone (reference counted; freed on any thread)."""

    def __init__(self, nbytes: int, zero: bool = False) -> None: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def address(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...
    def write_at(self, offset: int, source: object) -> None:
        """Copy a C-contiguous buffer's bytes to byte ``offset`` (GIL released); TypeError for a
        non-buffer, ValueError for a non-contiguous source or one past the end."""
    def to_dlpack(self, code: int, shape: Sequence[int]) -> object:
        """A 'dltensor' capsule over the first prod(shape) elements of byteps dtype ``code``
        (tf.experimental.dlpack.from_dlpack takes it); ValueError if they do not fit or their
        size overflows."""
