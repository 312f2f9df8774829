"""Argument checks every adapter makes, with the messages users see.

Example::

    check_root(root_rank, size())                     # ValueError unless 0 <= root_rank < size
    check_scale(2.0, 1.0, floating=False, what="allreduce('x')", got="int32")   # ValueError
"""

from __future__ import annotations

import numbers
from typing import Any

__all__ = ["check_root", "check_scale", "check_passes"]


def check_root(root_rank: Any, size: int) -> None:
    """ValueError unless ``root_rank`` is an integer rank (not a bool) in 0..size-1."""
    if isinstance(root_rank, bool) or not isinstance(root_rank, numbers.Integral) or not 0 <= root_rank < size:
        raise ValueError(f"broadcast: root_rank must be a rank in 0..{size - 1}, got {root_rank!r}")


def check_scale(prescale: float, postscale: float, floating: bool, what: str, got: Any,
                needed: str = "a floating-point tensor") -> None:
    """ValueError when scale factors other than 1 are given for integers (``got`` names their dtype)."""
    if (prescale != 1.0 or postscale != 1.0) and not floating:
        raise ValueError(f"{what}: prescale_factor/postscale_factor need {needed}, got {got}")


def check_passes(backward_passes_per_step: Any) -> None:
    """ValueError unless ``backward_passes_per_step`` is a positive integer (not a bool)."""
    if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) \
            or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be a positive integer, got {backward_passes_per_step!r}")
