"""How one tensor is cut into partitions and spread over the servers.

As in BytePS, a tensor larger than BYTEPS_PARTITION_BYTES is split into
partitions of at most that size (rounded down to whole elements); unlike
BytePS, the count is rounded up to a multiple of the server count, with
partitions of equal size, so every server gets the same share; each is a
key of its own on the wire, so partitions of one tensor are summed by
different servers in parallel and their transfers pipeline. The key is
``tensor_id << 16 | partition_index``. Which server sums a partition is the
caller's choice (``servers``, see :mod:`byteps.common.server_assignment`);
without one, partitions go round-robin over the servers starting from the
tensor's id, which spreads consecutive tensors.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence, Tuple

__all__ = ["Partition", "PartitionPlan", "MAX_PARTITIONS", "ServerChoice"]

PARTITION_INDEX_BITS = 16
MAX_PARTITIONS = 1 << PARTITION_INDEX_BITS

#: Picks the server of one partition from its key and size, called in partition order.
ServerChoice = Callable[[int, int], int]


@dataclasses.dataclass(frozen=True)
class Partition:
    key: int
    index: int
    offset: int  # in bytes, into the flat tensor
    nbytes: int
    server: int

    def outside(self, span: Optional[Tuple[int, int]]) -> bool:
        """Whether this partition lies wholly outside the byte range ``span`` = (start, end) (never for None)."""
        return span is not None and not (self.offset < span[1] and span[0] < self.offset + self.nbytes)

    def inside(self, spans: Sequence[Tuple[int, int]]) -> bool:
        """Whether this partition lies wholly inside one of the byte ranges ``spans``."""
        return any(start <= self.offset and self.offset + self.nbytes <= end for start, end in spans)


@dataclasses.dataclass(frozen=True)
class PartitionPlan:
    tensor_id: int
    nbytes: int
    partitions: Tuple[Partition, ...]

    @classmethod
    def build(cls, tensor_id: int, nbytes: int, itemsize: int, partition_bytes: int,
              num_servers: int, servers: Optional[ServerChoice] = None) -> PartitionPlan:
        """Split ``nbytes`` of ``itemsize``-byte elements; ValueError if too many partitions.

        ``servers(key, nbytes)`` places each partition, in index order (the
        largest partitions first: only the last one can be smaller); it must
        return an index below ``num_servers``. Default: round-robin from the
        tensor's id.
        """
        if num_servers < 1:
            raise ValueError("a partition plan needs at least one server")
        if itemsize < 1:
            raise ValueError(f"tensor {tensor_id}: element size must be at least 1 byte, got {itemsize}")
        step = max(itemsize, partition_bytes - partition_bytes % itemsize)
        count = -(-nbytes // step)
        if count > MAX_PARTITIONS:
            raise ValueError(
                f"tensor {tensor_id} of {nbytes} bytes needs {count} partitions of "
                f"BYTEPS_PARTITION_BYTES={partition_bytes}; at most {MAX_PARTITIONS} are possible, "
                "raise BYTEPS_PARTITION_BYTES"
            )
        if 1 < count and 1 < num_servers and count % num_servers:
            # Cut into a multiple of the server count, of equal size, so that a
            # large tensor loads every server alike (25 partitions over 4
            # servers would give one of them 7: 12% more bytes, 12% more time).
            elements = -(-nbytes // itemsize)
            wanted = -(-count // num_servers) * num_servers
            step = -(-elements // wanted) * itemsize
            count = -(-nbytes // step)
        if servers is None:
            def servers(key: int, size: int) -> int:
                return (tensor_id + (key & (MAX_PARTITIONS - 1))) % num_servers
        parts = []
        for index in range(count):
            key = (tensor_id << PARTITION_INDEX_BITS) | index
            size = min(step, nbytes - index * step)
            server = servers(key, size)
            if not 0 <= server < num_servers:
                raise ValueError(f"key {key} was placed on server {server}, but there are {num_servers}")
            parts.append(Partition(key=key, index=index, offset=index * step, nbytes=size, server=server))
        return cls(tensor_id=tensor_id, nbytes=nbytes, partitions=tuple(parts))
