"""What an adapter tells the front about its tensor type.

The front (compression, dtype tables) is written once against this
binding; each adapter fills one in for torch.Tensor, tf.Tensor or NDArray
in a few lines, so byteps-common never imports a framework.

Example (the torch adapter's)::

    TORCH = TensorBinding(float16=torch.float16, dtype=lambda t: t.dtype,
                          is_floating=lambda t: t.dtype.is_floating_point, cast=lambda t, dtype: t.to(dtype))
    _DTYPES = dtype_table(lambda name: getattr(torch, name))     # {torch.float32: DType.FLOAT32, ...}
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict

from byteps.common.dtypes import DType

__all__ = ["TensorBinding", "dtype_table"]


@dataclasses.dataclass(frozen=True)
class TensorBinding:
    """A framework's tensor as the front needs it."""

    #: the framework's float16 dtype (what ``Compression.fp16`` sends)
    float16: Any
    #: the framework dtype of a tensor
    dtype: Callable[[Any], Any]
    #: whether a tensor holds floating-point numbers (float16, bfloat16, float32, float64)
    is_floating: Callable[[Any], bool]
    #: a tensor converted to a dtype (a framework op, differentiable where the framework allows)
    cast: Callable[[Any, Any], Any]
    #: the framework's bfloat16 dtype (what ``Compression.bf16`` sends); None where it has none (MXNet 1.x)
    bfloat16: Any = None


def dtype_table(framework_dtype: Callable[[str], Any]) -> Dict[Any, DType]:
    """``{framework dtype: DType}`` for every dtype byteps reduces that the framework has.

    ``framework_dtype("float32")`` gives the framework's dtype of that name,
    or raises AttributeError when it has none (MXNet 1.x and bfloat16).
    """
    table = {}
    for dtype in DType:
        try:
            table[framework_dtype(dtype.name.lower())] = dtype
        except AttributeError:
            continue
    return table
