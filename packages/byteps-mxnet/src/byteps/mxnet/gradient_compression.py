"""BytePS's ``compression_params`` on MXNet: what DistributedTrainer and DistributedOptimizer do around each push_pull.

The codecs, error feedback and the Nesterov momentum of compressed
gradients run in byteps-common's worker core (docs/compression.md); the
adapter's part, as BytePS's MXNet ``DistributedTrainer`` has it:

* take the momentum factor from the optimizer and turn the optimizer's own
  momentum off (``optimizer_params["momentum"]``, or the attribute of an
  optimizer object), and with ``onebit`` its weight decay too;
* push every gradient large enough to be compressed alone, with the spec
  and the optimizer's current learning rate (error feedback rescales by its
  change); the smaller ones are fused as usual;
* give the gradients the core left uncompressed (small ones, or a job
  without servers) their Nesterov momentum after the pull:
  ``M = mu*(M + D); D = D + M`` (BytePS's ``NagAdapter``);
* with ``onebit``, add the weight decay back with its own momentum before
  the update (BytePS's ``WeightDecayMomentumAdapter``, :meth:`GradientCompression.add_weight_decay`).

Example::

    compression, optimizer_params = take_compression_params(
        {"compressor": "onebit", "ef": "vanilla", "momentum": "nesterov"}, "sgd",
        {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4})
    # optimizer_params == {"learning_rate": 0.1, "momentum": 0.0, "wd": 0.0}
"""

from __future__ import annotations

import inspect
from typing import Any, Dict, Mapping, Optional, Tuple

import mxnet as mx

from byteps.common import api
from byteps.common.compression import (
    CompressionSpec,
    NesterovMomentum,
    parse_compression_params,
    warn_if_feedback_meets_momentum,
)

__all__ = ["GradientCompression", "take_compression_params"]


class GradientCompression:
    """One trainer's (or optimizer's) compression_params with a codec: the spec and the momentum it owes.

    ``wd`` (onebit with Nesterov only) is the weight decay taken from the
    optimizer, 0 when there is none to add back.
    """

    def __init__(self, spec: CompressionSpec, wd: float = 0.0) -> None:
        self.spec = spec
        self.nesterov = NesterovMomentum(spec.momentum) if spec.momentum is not None else None
        self.wd = wd
        self._wd_momentum = NesterovMomentum(spec.momentum) if wd and spec.momentum is not None else None

    def after_pull(self, name: str, grad: mx.nd.NDArray, sent_nbytes: int) -> None:
        """Nesterov momentum on ``grad`` (the averaged gradient, after any fp16 cast back) if it went uncompressed.

        ``sent_nbytes``: the bytes the push_pull sent (after the cast), which
        the worker core compared with BYTEPS_MIN_COMPRESS_BYTES. Engine ops:
        they run after the push_pull has written ``grad``.
        """
        if self.nesterov is not None and not api.worker().compresses(sent_nbytes, True, self.spec):
            self.nesterov.apply(name, grad, mx.nd.zeros_like)

    def add_weight_decay(self, name: str, grad: mx.nd.NDArray, weight: mx.nd.NDArray, optimizer: Any,
                         index: Any) -> None:
        """BytePS's onebit weight-decay momentum: ``grad += (w + M) / rescale_grad``, ``M = mu*(M + w)``.

        ``w = wd * wd_mult * weight``. BytePS adds ``w`` plus its momentum to
        the gradient of large tensors, and adds ``w`` before the post-pull
        Nesterov step of small ones; both are this (Nesterov's step is
        linear), so every gradient gets it. It is divided by the optimizer's
        ``rescale_grad`` (1/batch size), which the optimizer multiplies back:
        BytePS's gradients are pre-divided by the batch size, ours are not.
        """
        if self._wd_momentum is None:
            return
        wd = self.wd * _wd_mult(optimizer, index)
        if not wd:
            return
        decay = weight.astype(grad.dtype, copy=True) * wd
        self._wd_momentum.apply(name, decay, mx.nd.zeros_like)
        grad += decay / optimizer.rescale_grad


def _momentum_of(optimizer: Any, optimizer_params: Optional[Dict[str, Any]]) -> float:
    """The momentum ``optimizer`` (an object, or a name created with ``optimizer_params``) will keep."""
    if isinstance(optimizer, mx.optimizer.Optimizer):
        return float(getattr(optimizer, "momentum", 0.0) or 0.0)
    if optimizer_params and "momentum" in optimizer_params:
        return float(optimizer_params["momentum"] or 0.0)
    registered = mx.optimizer.Optimizer.opt_registry.get(str(optimizer).lower())
    if registered is None:
        return 0.0
    parameter = inspect.signature(registered.__init__).parameters.get("momentum")  # Signum's default is 0.9
    if parameter is None or parameter.default is inspect.Parameter.empty:
        return 0.0
    return float(parameter.default or 0.0)


def _wd_mult(optimizer: mx.optimizer.Optimizer, index: Any) -> float:
    """``index``'s weight-decay multiplier, as MXNet's ``Optimizer._get_wds`` finds it."""
    if index in optimizer.param_dict:
        return float(optimizer.param_dict[index].wd_mult)
    if index in optimizer.wd_mult:
        return float(optimizer.wd_mult[index])
    if index in optimizer.idx2name:
        return float(optimizer.wd_mult.get(optimizer.idx2name[index], 1.0))
    return 1.0


def take_compression_params(params: Optional[Dict[str, Any]], optimizer: Any,
                            optimizer_params: Optional[Dict[str, Any]]
                            ) -> Tuple[Optional[CompressionSpec], Optional[GradientCompression], Optional[dict]]:
    """Parse ``params`` for ``optimizer`` (a name with ``optimizer_params``, or an optimizer object).

    Returns (the spec, or None when ``params`` asks for nothing; the
    :class:`GradientCompression` when it names a compressor, else None; the
    optimizer_params to create the optimizer with). With
    ``momentum="nesterov"`` the optimizer's momentum becomes 0.0, and with
    ``onebit`` its ``wd`` too (BytePS deletes both from optimizer_params; 0.0
    keeps an optimizer whose default momentum is not 0, such as Signum,
    from bringing its own back). The caller's dict is not changed; an
    optimizer object is. Raises ValueError naming a bad parameter.
    """
    if params and not isinstance(params, Mapping):
        raise ValueError(f"compression_params must be a dict, got {type(params).__name__}")
    if params and "type" in params:
        raise NotImplementedError(
            f"compression_params {{'type': {params['type']!r}}} is MXNet's kvstore compression, which byteps does "
            "not have; BytePS's are {'compressor': 'onebit' | 'topk' | 'randomk' | 'dithering', ...}")
    is_object = isinstance(optimizer, mx.optimizer.Optimizer)
    new_params = dict(optimizer_params) if optimizer_params else optimizer_params
    wants_momentum = bool(params) and str(params.get("momentum", "") or "").strip().lower() == "nesterov"
    mu = None
    if wants_momentum:
        mu = getattr(optimizer, "momentum", None) if is_object else (new_params or {}).get("momentum")
    spec = parse_compression_params(params, mu)
    if spec is None or spec.compressor == "none":
        return spec, None, new_params
    if spec.momentum is None:
        warn_if_feedback_meets_momentum(spec, _momentum_of(optimizer, new_params))
    wd = 0.0
    if spec.momentum is not None:
        if spec.compressor == "onebit":
            wd = float(optimizer.wd if is_object else (new_params or {}).get("wd", 0.0) or 0.0)
        if is_object:
            optimizer.momentum = 0.0
            if wd:
                optimizer.wd = 0.0
        else:
            new_params["momentum"] = 0.0
            if wd:
                new_params["wd"] = 0.0
    return spec, GradientCompression(spec, wd), new_params
