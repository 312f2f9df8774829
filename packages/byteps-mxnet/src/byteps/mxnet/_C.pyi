"""Type stub for byteps.mxnet._C: DLPack views of NDArrays and push_pulls on MXNet's engine.

No libmxnet inside: MXNet's C functions are reached through the addresses
bind_mxnet() is given. dtype codes are byteps.common.dtypes.DType wire codes:
float32 0, float64 1, float16 2, bfloat16 3, int32 4, int64 5.
"""

from typing import List, Optional, Sequence, Tuple

SUPPORTED_DTYPES: Tuple[str, ...]

View = Tuple[memoryview, int, Tuple[int, ...]]

class DLPackBuffer:
    """Owner of one DLManagedTensor; exports its bytes (format 'B', writable) and calls
    MXNet's deleter when the last view is released. Made by from_dlpack and EngineOp.views only."""

    @property
    def nbytes(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...

def from_dlpack(capsule: object) -> View:
    """Consume a 'dltensor' capsule (NDArray.to_dlpack_for_write()) of a contiguous CPU array.

    Returns (writable flat byte memoryview, byteps dtype code, shape); the memoryview
    keeps the array's memory alive. TypeError if not a capsule; ValueError for a used
    capsule, another device, an unsupported dtype, a non-contiguous array or a shape whose
    byte size overflows (the capsule then stays unconsumed).
    """

class EngineOp:
    """One push_pull on MXNet's engine: a ready op, then an end op waiting for finish()."""

    @property
    def id(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def done(self) -> bool: ...
    @property
    def error(self) -> str: ...
    def views(self) -> List[View]:
        """The arrays' bytes, inputs first; once only. ValueError for an unsupported dtype or
        device, RuntimeError if MXNet could not export an array."""
    def finish(self, error: str = "") -> None:
        """Complete the op (idempotent): MXNet ops waiting on its arrays may run; a non-empty
        error is raised by MXNet from the next read of an output."""
    def wait(self, timeout: float = -1.0) -> bool:
        """Wait for finish() with the GIL released; False on timeout (negative: no limit)."""

def bind_mxnet(to_dlpack: int, push_sync_nd: int, last_error: int) -> None:
    """Addresses of MXNDArrayToDLPack, MXEnginePushSyncND and MXGetLastError in the loaded libmxnet."""

def push(id: int, reads: Sequence[int], writes: Sequence[int], tokens: Sequence[int], priority: int,
         name: str) -> int:
    """Queue the ready op and the end op of one push_pull (NDArrayHandles as ints).

    ``reads`` are read, ``writes`` and ``tokens`` written; only ``reads`` and ``writes`` are
    handed to views(). Returns MXNet's return code: 0, or -1 with the error in MXGetLastError.
    """

def next_ready(timeout: float = -1.0) -> Optional[EngineOp]:
    """The next op whose arrays are ready (GIL released); None on timeout or once closed."""

def open_ready_queue() -> None:
    """Accept ready ops."""

def close_ready_queue(reason: str) -> None:
    """Fail queued and later ready ops with ``reason``; wakes next_ready()."""
