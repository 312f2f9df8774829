"""How one tensor is cut into partitions and spread over the servers.

As in BytePS, a tensor larger than BYTEPS_PARTITION_BYTES is split into
partitions of at most that size (rounded down to whole elements); each is a
key of its own on the wire, so partitions of one tensor are summed by
different servers in parallel and their transfers pipeline. The key is
``tensor_id << 16 | partition_index``; partitions go round-robin over the
servers starting from the tensor's id, which spreads consecutive tensors.
"""

from __future__ import annotations

import dataclasses
from typing import Tuple

__all__ = ["Partition", "PartitionPlan", "MAX_PARTITIONS"]

PARTITION_INDEX_BITS = 16
MAX_PARTITIONS = 1 << PARTITION_INDEX_BITS


@dataclasses.dataclass(frozen=True)
class Partition:
    key: int
    index: int
    offset: int  # in bytes, into the flat tensor
    nbytes: int
    server: int


@dataclasses.dataclass(frozen=True)
class PartitionPlan:
    tensor_id: int
    nbytes: int
    partitions: Tuple[Partition, ...]

    @classmethod
    def build(cls, tensor_id: int, nbytes: int, itemsize: int, partition_bytes: int,
              num_servers: int) -> PartitionPlan:
        """Split ``nbytes`` of ``itemsize``-byte elements; ValueError if too many partitions."""
        if num_servers < 1:
            raise ValueError("a partition plan needs at least one server")
        step = max(itemsize, partition_bytes - partition_bytes % itemsize)
        count = -(-nbytes // step)
        if count > MAX_PARTITIONS:
            raise ValueError(
                f"tensor {tensor_id} of {nbytes} bytes needs {count} partitions of "
                f"BYTEPS_PARTITION_BYTES={partition_bytes}; at most {MAX_PARTITIONS} are possible, "
                "raise BYTEPS_PARTITION_BYTES"
            )
        parts = tuple(
            Partition(
                key=(tensor_id << PARTITION_INDEX_BITS) | index,
                index=index,
                offset=index * step,
                nbytes=min(step, nbytes - index * step),
                server=(tensor_id + index) % num_servers,
            )
            for index in range(count)
        )
        return cls(tensor_id=tensor_id, nbytes=nbytes, partitions=parts)
