"""Grouped in-place push_pull of many torch tensors, small ones fused (byteps.common.fusion).

One call hands the whole list to byteps-common, which packs the small
tensors into shared buffers of at most BYTEPS_FUSION_THRESHOLD bytes and
push_pulls each buffer once, so a model's hundreds of biases and norms cost
a few messages instead of hundreds. Every rank must make the same call:
same names, shapes and dtypes, in the same order.

Example (``bpslaunch -np 2 -- python train.py``)::

    handles = bps.push_pull_group_async([p.grad for p in biases], names=[f"bias.{i}" for i in range(len(biases))])
    for handle in handles:
        bps.synchronize(handle)      # each gradient now holds the average, in place
"""

from __future__ import annotations

import time
from typing import Any, List, NamedTuple, Optional, Sequence

import torch

from byteps.common import api
from byteps.common.fusion import push_pull_group_async as fused_push_pull
from byteps.torch.compression import Compression
from byteps.torch.handles import PendingOp
from byteps.torch.ops import _handles, _key_name, _release, _reserve, _resolve_name, _speed, average_of
from byteps.torch.tensors import HostTensor, check_tensor, shares_memory

__all__ = ["push_pull_group_async"]


class _Member(NamedTuple):
    """One tensor of a grouped call, between submission and synchronize()."""

    name: str           # the user's name (reserved while in flight)
    token: object       # releases the name
    tensor: torch.Tensor
    host: HostTensor    # what byteps reads and writes (after compression, on the CPU)
    ctx: Any            # the compressor's context
    key: str            # the byteps tensor name (see ops._key_name)


def push_pull_group_async(tensors: Sequence[torch.Tensor], average: bool = True,
                          names: Optional[Sequence[str]] = None, compression: Any = Compression.none,
                          op: Optional[int] = None) -> List[int]:
    """Start in-place push_pulls of ``tensors``, small ones fused; one handle per tensor, in order.

    ``names`` defaults to ``"push_pull_group.noname.<n>.<i>"`` (the same on
    every rank only if all ranks issue their unnamed calls in the same
    order). ``op`` (Average/Sum) supersedes ``average``. Each tensor must
    be left alone until its handle is synchronize()d, which returns it.
    """
    average = average_of(op, None if op is not None else average)
    tensors = list(tensors)
    if names is None:
        base = _resolve_name("push_pull_group", None)
        names = [f"{base}.{i}" for i in range(len(tensors))]
    names = [_resolve_name("push_pull_group", name) for name in names]
    if len(names) != len(tensors):
        raise ValueError(f"push_pull_group: {len(tensors)} tensors but {len(names)} names")
    members: List[_Member] = []
    try:
        for name, tensor in zip(names, tensors):
            what = f"push_pull_group({name!r})"
            check_tensor(tensor, what)
            sent, ctx = compression.compress(tensor.detach())
            host = HostTensor.of(sent, what)
            token = _reserve(name, what)
            members.append(_Member(name, token, tensor, host, ctx, _key_name(name, host.host)))
        start = time.time()
        cores = fused_push_pull(api.worker(), [m.host.array for m in members], [m.key for m in members], average,
                                dtypes=[m.host.dtype for m in members])
    except BaseException:
        for member in members:
            _release(member.name, member.token)
        raise
    return [_pending(core, member, start, compression) for core, member in zip(cores, members)]


def _pending(core: Any, member: _Member, start: float, compression: Any) -> int:
    """Register one member's handle; its finish step runs in synchronize(), on the caller's thread."""
    nbytes = member.host.array.nbytes

    def finished(handle: Any) -> None:
        _release(member.name, member.token)
        if handle.error is None:
            _speed.record(start, nbytes)

    core.add_done_callback(finished)

    def finish() -> torch.Tensor:
        out = compression.decompress(member.host.on_device(), member.ctx)
        if not shares_memory(out, member.tensor):
            with torch.no_grad():
                member.tensor.copy_(out)
        return member.tensor

    return _handles.add(PendingOp(core, finish, lambda: _release(member.name, member.token)))
