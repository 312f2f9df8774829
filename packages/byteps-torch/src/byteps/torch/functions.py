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


def _describe_value(value: Any, param: torch.Tensor) -> Tuple:
    """One state entry: a tensor by shape, dtype and device; a list or tuple (LBFGS's history) item by item;
    anything else as it is."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device == param.device)
    if type(value) in (list, tuple):
        return ("sequence", type(value), [_describe_value(item, param) for item in value])
    return ("value", value)


def _describe_state(state: Dict[str, Any], param: torch.Tensor) -> Dict[str, Tuple]:
    """One parameter's optimizer state, as :func:`_describe_value` describes each entry."""
    return {key: _describe_value(value, param) for key, value in state.items()}


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
            optimizer.state[param] = {key: _adopt_value(entry, current.get(key), param)
                                      for key, entry in layout.items()}


def _adopt_value(entry: Tuple, old: Any, param: torch.Tensor) -> Any:
    """The root's value for one state entry: ``old`` where it is a tensor of the same kind (filled by the
    broadcast), zeros where it is not, the root's own for non-tensors."""
    if entry[0] == "value":
        return entry[1]
    if entry[0] == "sequence":
        _, kind, items = entry
        olds = list(old) if type(old) in (list, tuple) and len(old) == len(items) else [None] * len(items)
        return kind(_adopt_value(item, previous, param) for item, previous in zip(items, olds))
    _, shape, dtype, on_param_device = entry
    device = param.device if on_param_device else torch.device("cpu")
    keep = (isinstance(old, torch.Tensor) and tuple(old.shape) == shape and old.dtype == dtype
            and old.device == device)
    return old if keep else torch.zeros(shape, dtype=dtype, device=device)


def _state_tensors(name: str, entry: Tuple, value: Any) -> List[Tuple[str, torch.Tensor]]:
    """The tensors of one adopted state entry, named by where they sit (``<name>.<index>`` inside lists)."""
    if entry[0] == "tensor":
        return [(name, value)]
    if entry[0] == "sequence":
        return [pair for i, (item, inner) in enumerate(zip(entry[2], value))
                for pair in _state_tensors(f"{name}.{i}", item, inner)]
    return []


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int, model: Any = None) -> None:
    """Make every rank's optimizer state and hyperparameters equal to the root's.

    Covers state the optimizer creates lazily (on its first step) and
    parameters that have none (no gradient yet, or frozen): the root's layout
    is broadcast first, every other rank creates the entries it lacks (zeros
    until the broadcast fills them) and drops those the root lacks, then
    every state tensor is broadcast in place and scalar state (``step`` when
    it is a number) and ``param_groups`` options (lr, momentum, betas, ...)
    are taken from the root. Lists and tuples in the state (LBFGS keeps its
    history so, all of it under its first parameter) are taken item by item,
    so every optimizer in ``torch.optim`` is covered. Horovod instead forces state into existence
    with a zero-gradient ``step()``, which can move parameters (weight decay)
    and advances existing state; this does neither. What that step leaves
    behind, and scripts come to rely on, is kept: an optimizer with no state
    yet gets a zero gradient for every parameter that requires one and has
    none (a sparse one for SparseAdam, which takes no other). ``model`` is
    accepted for Horovod's signature (sparse parameters are broadcast like
    dense ones).
    """
    if not optimizer.state:
        sparse = isinstance(optimizer, torch.optim.SparseAdam)  # it refuses dense gradients
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.requires_grad and param.grad is None:
                    param.grad = torch.zeros_like(param).to_sparse() if sparse else torch.zeros_like(param)
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
                named += _state_tensors(f"OptimizerState.{g}.{i}.{key}", entry, optimizer.state[param][key])
    _broadcast_all(named, root_rank)
