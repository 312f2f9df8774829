"""The warning an adapter gives at the call when error feedback meets the optimizer's own momentum.

With ``ef: vanilla`` and momentum left in the optimizer (no
``momentum: nesterov`` in ``compression_params``), error feedback's delayed
corrections pass through that momentum, which multiplies them by up to
1/(1 - mu); when every tensor is compressed, training can diverge
(docs/compression.md, "Error feedback and the optimizer's own momentum").
Each adapter calls :func:`warn_if_feedback_meets_momentum` once, where it
parses ``compression_params`` and can see its optimizer's momentum::

    warn_if_feedback_meets_momentum(compression_params, optimizer_momentum=0.9)
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, Mapping, Optional, Union

from byteps.common.compression.spec import CompressionSpec

__all__ = ["FeedbackMomentumWarning", "warn_if_feedback_meets_momentum"]


class FeedbackMomentumWarning(UserWarning):
    """Error feedback with the optimizer's own momentum: training can diverge (docs/compression.md)."""


def _feedback_without_nesterov(params: Union[CompressionSpec, Mapping[str, Any], None]) -> Optional[str]:
    """What the compressor is, when ``params`` has error feedback and no compressor-side momentum; else None."""
    if isinstance(params, CompressionSpec):
        return params.describe() if params.ef and params.momentum is None else None
    if not isinstance(params, Mapping) or not params.get("compressor"):
        return None
    if _lowered(params, "ef") != "vanilla" or _lowered(params, "momentum") == "nesterov":
        return None
    return f"{_lowered(params, 'compressor')} ef=vanilla"


def _lowered(params: Mapping[str, Any], key: str) -> str:
    value = params.get(key)
    return value.strip().lower() if isinstance(value, str) else ""


def warn_if_feedback_meets_momentum(params: Union[CompressionSpec, Mapping[str, Any], None],
                                    optimizer_momentum: Optional[float]) -> bool:
    """Warn (:class:`FeedbackMomentumWarning`) when ``params`` has error feedback and the optimizer a momentum.

    ``params``: the user's ``compression_params`` dict or its parsed
    :class:`CompressionSpec`; ``optimizer_momentum``: the momentum factor
    the wrapped optimizer keeps (0 or None: none). Nothing is said when the
    compressor carries the momentum itself (``momentum: nesterov``, which
    takes the optimizer's away). The warning points at the user's line,
    the first caller outside byteps. Returns whether it warned.
    """
    what = _feedback_without_nesterov(params)
    if what is None or not optimizer_momentum or float(optimizer_momentum) <= 0.0:
        return False
    mu = float(optimizer_momentum)
    text = (f"compression_params ({what}) with the optimizer's own momentum {mu:g}: error feedback's delayed "
            f"corrections pass through that momentum (up to {1.0 / max(1.0 - mu, 1e-9):.3g}x) and training can "
            "diverge when every tensor is compressed. Add \"momentum\": \"nesterov\" to compression_params (the "
            "momentum then runs inside the feedback loop, as BytePS does), or keep BYTEPS_MIN_COMPRESS_BYTES "
            "(default 65536) high enough that small tensors go uncompressed; docs/compression.md, "
            "\"Error feedback and the optimizer's own momentum\"")
    warnings.warn(text, FeedbackMomentumWarning, stacklevel=_first_caller_outside_byteps())
    return True


def _first_caller_outside_byteps() -> int:
    """The stacklevel, for a warning raised in the caller, of the first frame not in a ``byteps.*`` module."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("byteps."):
        frame, level = frame.f_back, level + 1
    return level
