"""Which DistributedOptimizer handles each parameter's gradient: one post-accumulate-grad hook per parameter.

Wrapping the same parameters again (a new DistributedOptimizer for the
same model, with the same or another ``op``) moves each parameter's hook
to the new optimizer, so a gradient is never reduced twice, nor by two
optimizers at once.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["hook_gradient"]

_hooks: WeakIdKeyDictionary = WeakIdKeyDictionary()   # tensor -> RemovableHandle


def hook_gradient(param: torch.Tensor, hook: Callable[[torch.Tensor], None]) -> None:
    """Call ``hook(param)`` each time a gradient is accumulated into ``param.grad``, instead of any hook a
    previous DistributedOptimizer gave it."""
    previous = _hooks.pop(param, None)
    if previous is not None:
        previous.remove()
    _hooks[param] = param.register_post_accumulate_grad_hook(hook)
