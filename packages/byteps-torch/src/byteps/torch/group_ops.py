"""Grouped in-place push_pull of many torch tensors, small ones fused (byteps.common.fusion).

One call hands the whole list to byteps-common's front
(:mod:`byteps.common.frontend.group`), which packs the small tensors into
shared buffers of at most BYTEPS_FUSION_THRESHOLD bytes and
push_pulls each buffer once, so a model's hundreds of biases and norms cost
a few messages instead of hundreds. Every rank must make the same call:
same names, shapes and dtypes, in the same order.

Example (``bpslaunch -np 2 -- python train.py``)::

    handles = bps.push_pull_group_async([p.grad for p in biases], names=[f"bias.{i}" for i in range(len(biases))])
    for handle in handles:
        bps.synchronize(handle)      # each gradient now holds the average, in place
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import torch

from byteps.common.frontend import average_of
from byteps.common.frontend.group import submit_group
from byteps.torch.compression import Compression
from byteps.torch.ops import _tracker
from byteps.torch.tensors import TorchStaging

__all__ = ["push_pull_group_async"]


def push_pull_group_async(tensors: Sequence[torch.Tensor], average: bool = True,
                          names: Optional[Sequence[str]] = None, compression: Any = Compression.none,
                          op: Optional[int] = None, compression_spec: Any = None,
                          lr: Optional[float] = None) -> List[int]:
    """Start in-place push_pulls of ``tensors``, small ones fused; one handle per tensor, in order.

    ``names`` defaults to ``"push_pull_group.noname.<n>.<i>"`` (the same on
    every rank only if all ranks issue their unnamed calls in the same
    order). ``op`` (Average/Sum) supersedes ``average``. Each tensor must
    be left alone until its handle is synchronize()d, which returns it.
    ``compression_spec`` (BytePS's compression_params, parsed) and ``lr``
    compress the tensors large enough for it, each alone inside its bucket.
    """
    average = average_of(op, None if op is not None else average)
    return submit_group(_tracker, TorchStaging, tensors, names, average, compression, truncate_integers=True,
                        compression_spec=compression_spec, lr=lr)
