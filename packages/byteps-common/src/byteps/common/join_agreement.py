"""After ``hvd.join()``: every rank agrees again on what the others declared meanwhile.

While a rank had joined, the others may have declared tensors (ids come
from declaration order), moved their rounds on and placed partitions, and
used row-sparse tables (ids from first use, rounds of their own). Once
every rank has joined, each rank's :meth:`TensorRegistry.export` (and an
``extra`` of the caller's, anything JSON can carry, e.g. the front's name
state) goes to every rank through two sums on the worker's own reserved
tensors: each rank's size at its own slot, then each rank's bytes at its
own offset of one table.
"""

from __future__ import annotations

import json
from typing import Any, List

import numpy as np

from byteps.common.options import PushPullOptions

__all__ = ["agree_after_join"]


def agree_after_join(worker: Any, extra: Any) -> List[Any]:
    """Exchange every rank's declarations, rounds, placements and row-sparse tables; adopt what this rank
    missed. Returns every rank's ``extra``, in rank order."""
    registry = worker.registry
    blob = json.dumps({**registry.export(), "sparse": worker.sparse.export(), "extra": extra},
                      separators=(",", ":")).encode()
    sizes = np.zeros(worker.size, dtype=np.int64)
    sizes[worker.rank] = len(blob)
    summed = PushPullOptions(average=False, tensor_id=registry.reserved_id(0))
    worker.push_pull(sizes, "byteps.join.sizes", summed)
    words = [-(-int(n) // 4) for n in sizes]
    size_class = max(1, sum(words)).bit_length()
    table = np.zeros(1 << size_class, dtype=np.int32)
    start = sum(words[:worker.rank])
    padded = blob + bytes(4 * words[worker.rank] - len(blob))
    table[start:start + words[worker.rank]] = np.frombuffer(padded, dtype=np.int32)
    worker.push_pull(table, f"byteps.join.state.{size_class}",
                     summed.replace(tensor_id=registry.reserved_id(1 + size_class)))
    raw, states, offset = table.view(np.uint8), [], 0
    for rank, n in enumerate(sizes):
        states.append(json.loads(bytes(raw[4 * offset:4 * offset + int(n)])))
        offset += words[rank]
    registry.adopt(states)
    worker.sparse.adopt([state["sparse"] for state in states])
    return [state["extra"] for state in states]
