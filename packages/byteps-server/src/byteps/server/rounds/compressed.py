"""Compressed keys (docs/compression.md): the codec a round policy sums through.

A key whose INIT_KEY carries a compression description gets a
:class:`CompressedSums`, which its sum policy (:class:`~byteps.server.rounds.sync_sum.SyncSum`,
or :class:`~byteps.server.rounds.quorum.QuorumSum` with backup workers)
uses at two points: each push is decompressed before the engine sums it
(the engine holds the dense array until the round ends), and a closed
round's sum is compressed again, with this server's error feedback, into
the answer every pull of the round gets. The engine's sum is then released
at once; the compressed answers of the last two rounds are kept, since a
worker pulls round r only after pushing it and pushes r + 1 only after its
pull of r was answered, like the engine's own two rounds.

It is a strategy the sum policies hold, not a policy of its own, so that
compression combines with any way of closing a round (a quorum round keeps
its compressed answer in its history) without a class per combination.
"""

from __future__ import annotations

from typing import Any, Dict

import numpy as np

from byteps.common.compression import ServerPartition
from byteps.common.dtypes import DType
from byteps.common.tensor_description import PartitionSpec

__all__ = ["CompressedSums"]


class CompressedSums:
    """One compressed key's codec on its server: pushes decompressed, each round's sum compressed again."""

    def __init__(self, spec: PartitionSpec) -> None:
        dtype = DType(spec.dtype)
        # Built at INIT_KEY, before the key exists: a description the codec refuses refuses the key.
        self.partition = ServerPartition.from_wire(spec.compression, dtype, spec.nbytes // dtype.itemsize)
        self.answers: Dict[int, np.ndarray] = {}  # round -> compressed sum (the last two rounds)
        self.round_lr = float("nan")  # the learning rate the round's first push carried (error feedback)

    def decompress(self, payload: Any, first_of_round: bool) -> np.ndarray:
        """A push as the dense array the engine sums; the round's first push sets its learning rate."""
        dense, lr = self.partition.decompress_push(payload)
        if first_of_round:
            self.round_lr = lr
        return dense

    def keep(self, round_: int, total: Any) -> np.ndarray:
        """Compress round ``round_``'s sum into the answer its pulls get (returned); forget round - 2's."""
        answer = self.answers[round_] = self.partition.compress_sum(total, self.round_lr)
        self.answers.pop(round_ - 2, None)  # pulls come for the last two rounds at most, like the engine's
        return answer
