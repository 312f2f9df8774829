"""Reduction ops with Horovod's values, and how a call's ``op``/``average`` become byteps' average flag.

byteps servers sum; a worker divides the sum to average. ``Average`` and
``Sum`` go through the servers; Min, Max, Product and Adasum (``BY_GATHER``)
are computed by each rank from an allgather of every rank's tensor
(:func:`byteps.common.frontend.collectives.reduce_by_gather`).

Example::

    from byteps.common.frontend import Sum, average_of
    average_of(Sum, None)          # False: sum
    average_of(None, None)         # True: Horovod's default is the average
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

import numpy as np

from byteps.common.options import PushPullOptions

__all__ = ["Average", "Sum", "Adasum", "Min", "Max", "Product", "OP_NAMES", "op_name", "average_of",
           "check_gradient_op", "OpSpec", "divide_towards_zero", "BY_GATHER"]

Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max", Product: "Product"}
#: The ops every rank computes from all ranks' tensors rather than the servers' sum.
BY_GATHER = (Min, Max, Product, Adasum)


def op_name(op: Any) -> Any:
    """``"Adasum"`` for 2, ...; an unknown value as it is."""
    return OP_NAMES.get(op, op)


def average_of(op: Optional[int], average: Optional[bool], default: bool = True) -> bool:
    """Horovod's rule: ``op`` supersedes ``average``; ops other than Average and Sum are not supported."""
    if op is None:
        return default if average is None else bool(average)
    if average is not None:
        raise ValueError("the op parameter supersedes average: pass only one of them")
    if op == Average:
        return True
    if op == Sum:
        return False
    raise NotImplementedError(f"op={op_name(op)} is not a sum: byteps' push_pull takes op=Average or op=Sum "
                              "(allreduce computes Min, Max, Product and Adasum)")


def check_gradient_op(op: Any, gradient_predivide_factor: float) -> None:
    """The checks of every gradient-averaging wrapper (optimizers, tapes) on ``op`` and the predivide factor.

    Adasum passes here: each adapter implements it as Horovod does (the delta optimizer in torch and TF1, the
    gradients reduced by Adasum in tapes and Keras)."""
    if op not in (Average, Sum, Adasum):
        raise ValueError(f"op must be Average, Sum or Adasum, got {op!r}")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor is only supported with op=Average")
    if gradient_predivide_factor <= 0:
        raise ValueError(f"gradient_predivide_factor must be positive, got {gradient_predivide_factor}")


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """What to do with one tensor: op family (for default names), name, averaging, scaling, engine priority."""

    family: str
    name: Optional[str]
    average: bool
    prescale: float = 1.0
    postscale: float = 1.0
    priority: int = 0
    members: Optional[Tuple[int, ...]] = None  # a process set's ranks; None: every rank
    set_id: int = 0                            # that process set's id
    root: Optional[int] = None                 # a broadcast's root rank

    def push_pull_options(self, **more: Any) -> PushPullOptions:
        """The worker's options for this op (averaging, process set, root), with ``more`` (output, dtype,
        compression, lr, stream)."""
        return PushPullOptions(average=self.average, members=self.members, set_id=self.set_id, root=self.root,
                               **more)

    def for_gradient(self) -> OpSpec:
        """The same reduction of the gradient, under ``"<name>.grad"``."""
        return dataclasses.replace(self, name=None if self.name is None else self.name + ".grad")


def divide_towards_zero(summed: np.ndarray, count: int) -> None:
    """``summed //= count`` in place, rounding towards zero (``-3 / 2 == -1``): Horovod's torch integer average,
    where byteps-common's own average floors."""
    np.copyto(summed, np.sign(summed) * (np.abs(summed) // count), casting="unsafe")
