"""Each tensor's shared-memory segment on a machine, cut into one slot per local rank.

With BYTEPS_LOCAL_SIZE = L worker processes on a machine, a tensor has one
segment of L slots (:mod:`byteps.common.shared_segment`), named per job,
machine and tensor, each slot aligned to 64 bytes. A rank copies its input
into its own slot; a partition's local root sums the others' slots into its
own, where the result is read by everyone.
"""

from __future__ import annotations

from typing import Dict

import numpy as np

from byteps.common.partition import Partition
from byteps.common.shared_segment import SharedSegment, segment_name

__all__ = ["TensorSegment", "SlotTable"]

_ALIGN = 64


def _slot_bytes(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


class TensorSegment:
    """One tensor's segment, cut into L slots."""

    def __init__(self, segment: SharedSegment, nbytes: int) -> None:
        self.segment = segment
        self.nbytes = nbytes
        self.stride = _slot_bytes(nbytes)
        self.array = np.frombuffer(segment.view, dtype=np.uint8)

    def slot(self, rank: int, part: Partition) -> np.ndarray:
        start = rank * self.stride + part.offset
        return self.array[start:start + part.nbytes]

    def whole(self, rank: int) -> np.ndarray:
        return self.array[rank * self.stride:rank * self.stride + self.nbytes]


class SlotTable:
    """The segments of one machine's tensors, as this process has mapped them."""

    def __init__(self, job_id: str, machine: int, local_size: int) -> None:
        self.job_id, self.machine, self.local_size = job_id, machine, local_size
        self.segments: Dict[int, TensorSegment] = {}

    def __getitem__(self, tensor_id: int) -> TensorSegment:
        return self.segments[tensor_id]

    def segment_of(self, tensor_id: int, nbytes: int, what: str) -> TensorSegment:
        """The tensor's segment, mapped (and created by the first rank) on first use; ValueError if the tensor
        changed size."""
        segment = self.segments.get(tensor_id)
        if segment is not None and segment.nbytes != nbytes:
            raise ValueError(f"{what}: {nbytes} bytes, but earlier rounds had {segment.nbytes}; "
                             "a tensor keeps its size for the whole job")
        if segment is None:
            name = segment_name(self.job_id, self.machine, tensor_id)
            shared = SharedSegment.open_or_create(name, self.local_size * _slot_bytes(nbytes))
            segment = self.segments[tensor_id] = TensorSegment(shared, nbytes)
        return segment

    def close(self) -> None:
        for segment in self.segments.values():
            segment.array = None
            segment.segment.unlink()
            segment.segment.close()
        self.segments.clear()
