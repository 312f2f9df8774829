"""What a worker and a server do around a codec: BytePS's momentum, error feedback and learning-rate ratio.

Per partition and round, on the worker that pushes it (BytePS's decorator
order, docs/compression.md)::

    p = g * prescale                   # 1/size when averaging: servers only sum compressed tensors
    m = p + mu*m;  p = p + mu*m        # Nesterov momentum (momentum="nesterov")
    p = p + (lr_prev/lr) * e           # error feedback (ef="vanilla")
    c = C(p);  e = p - D(c)            # compress; remember what it lost
    push c, and lr

and on the server, once every worker's push is summed: the same error
feedback around the same codec, with the learning rate the pushes carried
(BytePS read it from a file in the working directory). The pull answers
with the compressed sum, which the worker decompresses.

Example::

    worker = WorkerPartition(spec, DType.FLOAT32, count=1000)
    payload = worker.compress(gradient_bytes, lr=0.1, prescale=0.5)
    server = ServerPartition(spec, DType.FLOAT32, count=1000)
    dense, lr = server.decompress_push(payload)
"""

from __future__ import annotations

import struct
from typing import Any, Mapping, Optional, Sequence, Tuple

import numpy as np

from byteps.common import _C
from byteps.common.compression.segments import codec_for
from byteps.common.compression.spec import CompressionSpec
from byteps.common.dtypes import DType

__all__ = ["WorkerPartition", "ServerPartition", "TensorCompressor", "NesterovMomentum", "LR_BYTES"]

#: A push's compressed bytes are followed by the learning rate (float64; NaN when the adapter knows none).
LR_BYTES = 8
_LR = struct.Struct("<d")


def _lr_ratio(previous: Optional[float], current: float) -> float:
    """BytePS's error rescaling lr_{t-1}/lr_t (1 when either is unknown or zero)."""
    if previous is None or not previous == previous or not current == current or not current or not previous:
        return 1.0
    return previous / current


class WorkerPartition:
    """One partition's compression state on the worker that pushes it: codec, momentum, error.

    ``segments`` (element counts): a fused bucket's partition, each member
    compressed alone (:class:`~byteps.common.compression.segments.SegmentedCodec`).
    """

    def __init__(self, spec: CompressionSpec, dtype: DType, count: int,
                 segments: Optional[Sequence[int]] = None) -> None:
        self.spec, self.dtype = spec, DType(dtype)
        self.codec = codec_for(spec, dtype, count, segments)
        storage = self.dtype.storage
        self.work = np.empty(count, storage)  # p: never the caller's tensor, which is not ours to change
        self.error = np.zeros(count, storage) if spec.ef else None
        self.momentum = np.zeros(count, storage) if spec.momentum is not None else None
        self.out = np.empty(self.codec.nbytes + LR_BYTES, np.uint8)
        self.lr_prev: Optional[float] = None

    @property
    def pull_nbytes(self) -> int:
        """Bytes of the server's answer: the compressed sum."""
        return self.codec.nbytes

    def compress(self, data: np.ndarray, lr: Optional[float], prescale: float) -> np.ndarray:
        """The payload to push for ``data`` (the partition's bytes); the buffer is reused next round."""
        dtype = int(self.dtype)
        grad = data.view(self.work.dtype)
        if prescale != 1.0:
            np.multiply(grad, prescale, out=self.work)
        else:
            self.work[:] = grad
        if self.momentum is not None:
            _C.nesterov(self.work, self.momentum, dtype, self.spec.momentum)
        lr_value = float("nan") if lr is None else float(lr)
        if self.error is not None:
            _C.axpy(self.work, self.error, dtype, _lr_ratio(self.lr_prev, lr_value))
            self.lr_prev = lr_value
        compressed = self.out[:self.codec.nbytes]
        self.codec.compress(self.work, compressed, error=self.error)  # e = p - D(c) in the same pass
        self.out[self.codec.nbytes:] = np.frombuffer(_LR.pack(lr_value), np.uint8)
        return self.out

    def decompress(self, compressed, dense: np.ndarray) -> None:
        """``dense`` (the partition's bytes) = the server's compressed sum, decompressed."""
        self.codec.decompress(compressed, dense.view(self.work.dtype))


class ServerPartition:
    """One key's compression on its server: each push decompressed, the sum compressed again."""

    def __init__(self, spec: CompressionSpec, dtype: DType, count: int,
                 segments: Optional[Sequence[int]] = None) -> None:
        self.spec, self.dtype = spec, DType(dtype)
        self.codec = codec_for(spec, dtype, count, segments)
        self.count = count
        self.error = np.zeros(count, self.dtype.storage) if spec.ef else None
        self.lr_prev: Optional[float] = None

    @classmethod
    def from_wire(cls, fields: Mapping[str, Any], dtype: DType, count: int) -> ServerPartition:
        """The partition INIT_KEY declares: :meth:`TensorCompressor.wire`'s fields."""
        fields = dict(fields)
        segments = fields.pop("segments", None)
        return cls(CompressionSpec.from_wire(fields), dtype, count, segments)

    @property
    def push_nbytes(self) -> int:
        return self.codec.nbytes + LR_BYTES

    def decompress_push(self, payload) -> Tuple[np.ndarray, float]:
        """A worker's push as a dense array (a new one: the summation engine holds it) and its learning rate."""
        view = memoryview(payload).cast("B")
        if len(view) != self.push_nbytes:
            raise ValueError(f"a compressed push of {len(view)} bytes; this key's {self.spec.describe()} "
                             f"pushes are {self.push_nbytes} bytes")
        dense = np.empty(self.count, self.dtype.storage)
        self.codec.decompress(view[:self.codec.nbytes], dense)
        return dense, _LR.unpack(view[self.codec.nbytes:])[0]

    def compress_sum(self, total, lr: float) -> np.ndarray:
        """The round's sum, compressed (with this server's error feedback), as the pull answers it."""
        work = np.frombuffer(total, self.dtype.storage).copy()
        dtype = int(self.dtype)
        if self.error is not None:
            _C.axpy(work, self.error, dtype, _lr_ratio(self.lr_prev, lr))
            self.lr_prev = lr
        out = np.empty(self.codec.nbytes, np.uint8)
        if self.error is None:
            self.codec.compress(work, out)
        else:
            # e = p - D(c) in place over p, a copy of its own: it becomes the error kept.
            self.codec.compress(work, out, error=work)
            self.error = work
        return out


class NesterovMomentum:
    """Momentum for the tensors that go uncompressed (below BYTEPS_MIN_COMPRESS_BYTES, or no servers).

    The adapter turned the optimizer's momentum off; BytePS applies it to
    such tensors after the pull, on the averaged gradient: ``M = mu*(M + D);
    D = D + M``, which equals the workers' Nesterov step on the sum.
    ``gradient`` is any array with in-place ``+=``/``*=`` (numpy, torch);
    ``zeros_like`` makes its first buffer.
    """

    def __init__(self, mu: float) -> None:
        self.mu = mu
        self._buffers: dict = {}

    def apply(self, name: str, gradient, zeros_like=np.zeros_like) -> None:
        """Update ``gradient`` in place with ``name``'s momentum."""
        buffer = self._buffers.get(name)
        if buffer is None or tuple(buffer.shape) != tuple(gradient.shape) or buffer.dtype != gradient.dtype:
            buffer = self._buffers[name] = zeros_like(gradient)
        buffer += gradient
        buffer *= self.mu
        gradient += buffer


def _counts(segments: Optional[Sequence[int]]) -> Optional[Tuple[int, ...]]:
    """A bucket's segments as a tuple of ints (None: not a bucket)."""
    return tuple(int(count) for count in segments) if segments is not None else None


class TensorCompressor:
    """A compressed tensor's state on one worker, kept from round to round: one WorkerPartition per partition.

    ``segments``: a fused bucket (one partition) whose members, of these
    element counts, are compressed each alone.
    """

    def __init__(self, spec: CompressionSpec, dtype: DType, segments: Optional[Sequence[int]] = None) -> None:
        self.spec, self.dtype = spec, DType(dtype)
        self.segments = _counts(segments)
        self._partitions: dict = {}

    def matches(self, spec: CompressionSpec, dtype: DType, segments: Optional[Sequence[int]]) -> bool:
        """Whether this state serves a push_pull with these settings (else it starts afresh)."""
        return self.spec == spec and self.dtype == DType(dtype) and self.segments == _counts(segments)

    def wire(self) -> dict:
        """What INIT_KEY tells the servers: the spec's fields, and a bucket's segments."""
        fields = self.spec.wire()
        if self.segments is not None:
            fields["segments"] = list(self.segments)
        return fields

    def partition(self, index: int, nbytes: int) -> WorkerPartition:
        found = self._partitions.get(index)
        if found is None:
            found = self._partitions[index] = WorkerPartition(self.spec, self.dtype, nbytes // self.dtype.itemsize,
                                                              self.segments)
        return found
