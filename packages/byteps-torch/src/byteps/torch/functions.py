"""Broadcast a model's parameters, an optimizer's state and any picklable object.

Example, at the start of training::

    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bps.broadcast_optimizer_state(optimizer, root_rank=0)
    epoch = bps.broadcast_object(epoch, root_rank=0, name="epoch")

Every rank must make the same calls in the same order (tensors go through
:func:`~byteps.torch.horovod_ops.broadcast_async_`; ``broadcast_object`` is
byteps-common's front's, :func:`byteps.common.frontend.broadcast_object`).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import torch

from byteps.common.frontend import Sum, broadcast_object, rank
from byteps.torch.horovod_ops import allreduce_, broadcast_async_
from byteps.torch.ops import synchronize

__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object"]

Params = Union[Dict[str, torch.Tensor], Iterable[Union[torch.Tensor, Tuple[str, torch.Tensor]]]]


def _broadcast_all(named: List[Tuple[Optional[str], torch.Tensor]], root_rank: int) -> None:
    """Broadcast tensors in place, all in flight at once; non-contiguous ones through a copy."""
    pending = []
    for name, tensor in named:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"cannot broadcast {name or 'an entry'}: it is a {type(tensor).__name__}, not a tensor")
        target = tensor.detach()
        work = target if target.is_contiguous() else target.contiguous()
        pending.append((broadcast_async_(work, root_rank, name=name), target, work))
    for handle, target, work in pending:
        synchronize(handle)
        if work is not target:
            target.copy_(work)


def broadcast_parameters(params: Params, root_rank: int) -> None:
    """Overwrite ``params`` on every rank with the root's, in place.

    ``params`` is a ``state_dict()`` (broadcast in sorted name order) or an
    iterable such as ``model.named_parameters()`` or ``model.parameters()``.
    Named tensors go by ``"Parameter.<name>"``, unnamed ones by default names.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    _broadcast_all([(None if name is None else f"Parameter.{name}", tensor) for name, tensor in items], root_rank)


def _describe_state(state: Dict[str, Any], param: torch.Tensor) -> Dict[str, Tuple]:
    """One parameter's optimizer state: tensors by shape, dtype and device, other values as they are."""
    described = {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            described[key] = ("tensor", tuple(value.shape), value.dtype, value.device == param.device)
        else:
            described[key] = ("value", value)
    return described


def _describe(optimizer: torch.optim.Optimizer) -> List[Dict[str, Any]]:
    groups = []
    for group in optimizer.param_groups:
        options = {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v)
                   for k, v in group.items() if k != "params"}
        groups.append({
            "options": options,
            "shapes": [tuple(p.shape) for p in group["params"]],
            "state": [_describe_state(optimizer.state.get(p, {}), p) for p in group["params"]],
        })
    return groups


def _mismatch(optimizer: torch.optim.Optimizer, root: List[Dict[str, Any]]) -> Optional[str]:
    mine = [[tuple(p.shape) for p in group["params"]] for group in optimizer.param_groups]
    theirs = [group["shapes"] for group in root]
    if mine != theirs:
        return (f"broadcast_optimizer_state: rank {rank()} has parameter groups of shapes {mine}, "
                f"the root has {theirs}; every rank must build the same optimizer")
    return None


def _adopt(optimizer: torch.optim.Optimizer, root: List[Dict[str, Any]]) -> None:
    """Give this rank the root's options and state layout; tensors keep or get zeros until broadcast."""
    for group, described in zip(optimizer.param_groups, root):
        for key, value in described["options"].items():
            current = group.get(key)
            if isinstance(value, torch.Tensor) and isinstance(current, torch.Tensor) \
                    and current.shape == value.shape:
                with torch.no_grad():
                    current.copy_(value)
            else:
                group[key] = value
        for param, layout in zip(group["params"], described["state"]):
            if not layout:
                optimizer.state.pop(param, None)
                continue
            current = optimizer.state.get(param, {})
            state = {}
            for key, entry in layout.items():
                if entry[0] == "value":
                    state[key] = entry[1]
                    continue
                _, shape, dtype, on_param_device = entry
                device = param.device if on_param_device else torch.device("cpu")
                old = current.get(key)
                keep = (isinstance(old, torch.Tensor) and tuple(old.shape) == shape and old.dtype == dtype
                        and old.device == device)
                state[key] = old if keep else torch.zeros(shape, dtype=dtype, device=device)
            optimizer.state[param] = state


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int, model: Any = None) -> None:
    """Make every rank's optimizer state and hyperparameters equal to the root's.

    Covers state the optimizer creates lazily (on its first step) and
    parameters that have none (no gradient yet, or frozen): the root's layout
    is broadcast first, every other rank creates the entries it lacks (zeros
    until the broadcast fills them) and drops those the root lacks, then
    every state tensor is broadcast in place and scalar state (``step`` when
    it is a number) and ``param_groups`` options (lr, momentum, betas, ...)
    are taken from the root. Horovod instead forces state into existence
    with a zero-gradient ``step()``, which can move parameters (weight decay)
    and advances existing state; this does neither. What that step leaves
    behind, and scripts come to rely on, is kept: an optimizer with no state
    yet gets a zero gradient for every parameter that requires one and has
    none. ``model`` is accepted for Horovod's signature (sparse parameters
    are broadcast like dense ones).
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state (it is not per parameter)")
    if not optimizer.state:
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.requires_grad and param.grad is None:
                    param.grad = torch.zeros_like(param)
    is_root = rank() == root_rank
    root = broadcast_object(_describe(optimizer) if is_root else None, root_rank,
                            name="broadcast_optimizer_state.layout")
    problem = None if is_root else _mismatch(optimizer, root)
    failures = torch.tensor([0 if problem is None else 1], dtype=torch.int32)
    allreduce_(failures, op=Sum, name="broadcast_optimizer_state.check")  # no rank goes on alone
    if problem is not None:
        raise ValueError(problem)
    if failures.item():
        raise ValueError("broadcast_optimizer_state: another rank's optimizer has parameter groups that differ "
                         "from the root's (its own error says how)")
    if not is_root:
        _adopt(optimizer, root)
    named = []
    for g, (group, described) in enumerate(zip(optimizer.param_groups, root)):
        for i, (param, layout) in enumerate(zip(group["params"], described["state"])):
            for key, entry in layout.items():
                if entry[0] == "tensor":
                    named.append((f"OptimizerState.{g}.{i}.{key}", optimizer.state[param][key]))
    _broadcast_all(named, root_rank)
