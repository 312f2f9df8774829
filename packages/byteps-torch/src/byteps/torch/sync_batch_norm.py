"""Batch normalization over the whole distributed batch: Horovod's ``hvd.SyncBatchNorm``.

In training, each channel's mean and variance are those of every rank's
batch together (of ``process_set``'s ranks), not of this rank's alone, so
that small per-rank batches normalize as one large batch would. The
statistics travel as sums: one allreduce of [count, sum, sum of squares]
per forward (float64, so that the variance does not lose precision to
cancellation), and one of [sum of dy, sum of dy * (x - mean)] per backward,
from which each rank computes its input's gradient as a single process
would on the whole batch. The weight's and bias's gradients are this
rank's share (as torch's SyncBatchNorm leaves them), for the optimizer to
average like any other gradient. Running statistics use the unbiased
variance of the whole batch. In evaluation, or with one rank, it is
``torch.nn.BatchNorm``.

Example::

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), bps.SyncBatchNorm(8), torch.nn.ReLU())
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from byteps.common.frontend.process_sets import global_process_set
from byteps.common.frontend.reductions import Sum
from byteps.torch.horovod_ops import allreduce

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(_BatchNorm):
    """``torch.nn.BatchNorm1d/2d/3d`` with statistics over every rank's batch (Horovod's arguments)."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_set: Any = global_process_set) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm: expected an input of at least 2 dimensions (N, C, ...), "
                             f"got {input.dim()}")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a cumulative moving average, as torch's BatchNorm
                factor = 1.0 / float(self.num_batches_tracked)
        if not self.training or self.process_set.size() == 1:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                                self.training or not self.track_running_stats, factor, self.eps)
        running = (self.running_mean, self.running_var) if self.track_running_stats else (None, None)
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, *running, self.eps, factor,
                                            self.process_set)


def _channels_last(tensor: torch.Tensor) -> torch.Tensor:
    """(N, C, *) as (C, N * prod(*)): one row per channel."""
    return tensor.transpose(0, 1).reshape(tensor.shape[1], -1)


def _shape_like(row: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
    """A per-channel vector shaped to broadcast over (N, C, *)."""
    return row.view(1, -1, *([1] * (input.dim() - 2)))


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                running_mean: Optional[torch.Tensor], running_var: Optional[torch.Tensor], eps: float,
                momentum: float, process_set: Any) -> torch.Tensor:
        rows = _channels_last(input.detach()).to(torch.float64)
        count = torch.tensor([float(rows.shape[1])], dtype=torch.float64, device=input.device)
        sums = allreduce(torch.cat([count, rows.sum(1), (rows * rows).sum(1)]), op=Sum,
                         name="SyncBatchNorm.stats", process_set=process_set)
        channels = rows.shape[0]
        total = sums[0]
        if total.item() < 2:
            raise ValueError(f"SyncBatchNorm: expected more than 1 value per channel over all ranks in training, "
                             f"got {int(total.item())}")
        mean = sums[1:1 + channels] / total
        var = (sums[1 + channels:] / total - mean * mean).clamp_(min=0.0)
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
                unbiased = var * total / (total - 1)
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        mean_, invstd_ = (_shape_like(v.to(input.dtype), input) for v in (mean, invstd))
        normalized = (input - mean_) * invstd_
        output = normalized
        if weight is not None:
            output = output * _shape_like(weight, input)
        if bias is not None:
            output = output + _shape_like(bias, input)
        ctx.save_for_backward(normalized, invstd.to(input.dtype), weight)
        ctx.total, ctx.process_set, ctx.has_bias = total, process_set, bias is not None
        return output

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        normalized, invstd, weight = ctx.saved_tensors
        grad_rows = _channels_last(grad_output).to(torch.float64)
        xhat_rows = _channels_last(normalized).to(torch.float64)
        local = torch.cat([grad_rows.sum(1), (grad_rows * xhat_rows).sum(1)])  # sum dy, sum dy * xhat
        channels = grad_rows.shape[0]
        grad_weight = local[channels:].to(grad_output.dtype) if weight is not None else None
        grad_bias = local[:channels].to(grad_output.dtype) if ctx.has_bias else None
        grad_input = None
        if ctx.needs_input_grad[0]:
            sums = allreduce(local, op=Sum, name="SyncBatchNorm.grad", process_set=ctx.process_set)
            mean_dy = _shape_like((sums[:channels] / ctx.total).to(grad_output.dtype), grad_output)
            mean_dy_xhat = _shape_like((sums[channels:] / ctx.total).to(grad_output.dtype), grad_output)
            scale = invstd if weight is None else invstd * weight
            grad_input = (grad_output - mean_dy - normalized * mean_dy_xhat) * _shape_like(scale, grad_output)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None
