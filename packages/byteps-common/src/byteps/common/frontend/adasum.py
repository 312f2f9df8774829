"""Adasum as Horovod defines it, from every rank's tensor.

Horovod's Adasum (``op=hvd.Adasum``) combines two gradients ``a`` and ``b``
so that parallel parts are averaged and orthogonal parts added::

    adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

(a coefficient is 1 where its norm squared is below sqrt(DBL_MIN)), and
reduces ``n`` ranks, ``n`` a power of two, as a binary tree: ranks 0 and 1,
2 and 3, ... first, then those results pairwise, and so on. Dot products and
norms are taken over the whole tensor in float64; each level's result is
rounded to the tensor's dtype, as Horovod's vector-halving implementation
does (adasum.h).

byteps' servers only sum, so Adasum is computed where it is simplest: every
rank gathers the others' tensors (:func:`~byteps.common.frontend.collectives.reduce_by_gather`)
and reduces the tree itself; every rank computes the same numbers in the
same order, so all ranks get bit-identical results. That moves ``n`` times
the tensor per rank, so Adasum suits the small-to-medium tensors it is used
for (Horovod's delta optimizer and metrics), not 100 MB gradients.
"""

from __future__ import annotations

import math
import sys
from typing import List, Sequence

import numpy as np

__all__ = ["adasum_pair", "adasum_tree", "check_adasum"]

_SMALLEST_NORM_SQUARED = math.sqrt(sys.float_info.min)  # Horovod's sqrt(DBL_MIN)


def check_adasum(ranks: int, dtype: np.dtype, what: str) -> None:
    """Horovod's limits: a power-of-two number of ranks, floating-point tensors."""
    if ranks < 1 or ranks & (ranks - 1):
        raise NotImplementedError(f"{what}: Adasum needs a power-of-two number of ranks (as in Horovod), "
                                  f"this job has {ranks}")
    if np.dtype(dtype).kind != "f":
        raise NotImplementedError(f"{what}: Adasum reduces floating-point tensors only, got {np.dtype(dtype)}")


def adasum_pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Horovod's pairwise Adasum of two tensors of one shape and dtype, in that dtype."""
    wide_a, wide_b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    dot = float(np.dot(wide_a, wide_b))
    a_squared, b_squared = float(np.dot(wide_a, wide_a)), float(np.dot(wide_b, wide_b))
    a_coefficient = 1.0 - dot / a_squared * 0.5 if a_squared >= _SMALLEST_NORM_SQUARED else 1.0
    b_coefficient = 1.0 - dot / b_squared * 0.5 if b_squared >= _SMALLEST_NORM_SQUARED else 1.0
    return (a_coefficient * wide_a + b_coefficient * wide_b).astype(a.dtype).reshape(a.shape)


def adasum_tree(tensors: Sequence[np.ndarray]) -> np.ndarray:
    """Adasum of the ranks' tensors (in rank order), as Horovod's binary tree combines them."""
    level: List[np.ndarray] = list(tensors)
    if not level or len(level) & (len(level) - 1):
        raise NotImplementedError(f"Adasum needs a power-of-two number of tensors, got {len(level)}")
    while len(level) > 1:
        level = [adasum_pair(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0].copy()
