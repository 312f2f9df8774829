"""A communication hook that lets torch's own DistributedDataParallel average through byteps.

Native DDP keeps doing what it does well (bucketing gradients, overlapping
their reduction with backward, ``no_sync``, ``static_graph``); the hook
replaces only the allreduce of each bucket with a byteps push_pull, so the
gradients travel through the parameter servers.

Native DDP still needs a ``torch.distributed`` process group (it broadcasts
the initial parameters and agrees on bucket layouts through it). Any
backend works; gloo next to byteps, with byteps' rank and size, is enough::

    import os
    import torch.distributed as dist
    import byteps.torch as bps
    from byteps.torch.parallel import byteps_hook

    bps.init()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")   # rank 0's machine
    os.environ.setdefault("MASTER_PORT", "29500")       # a free port there
    dist.init_process_group("gloo", rank=bps.rank(), world_size=bps.size())
    model = torch.nn.parallel.DistributedDataParallel(Net())
    model.register_comm_hook(state=None, hook=byteps_hook)

On several machines set MASTER_ADDR and MASTER_PORT in every worker's
environment to an address and port of the machine that runs rank 0.

BytePS's gradient compression (docs/compression.md) applies to the
buckets with a :class:`HookState`: each bucket is compressed on its way to
the servers (every bucket of at least BYTEPS_MIN_COMPRESS_BYTES)::

    state = HookState(compression_params={"compressor": "topk", "k": 0.01, "ef": "vanilla"},
                      lr=lambda: optimizer.param_groups[0]["lr"])
    model.register_comm_hook(state=state, hook=byteps_hook)

Nesterov momentum belongs to the optimizer, which the hook does not see:
use DistributedOptimizer's ``compression_params`` for it.
"""

# No ``from __future__ import annotations`` here: torch's register_comm_hook
# compares the hook's annotations with the real types.
from typing import Any, Callable, Dict, Optional

import torch
import torch.distributed

from byteps.common.compression import parse_compression_params
from byteps.torch.ops import handle_done_callback, push_pull_async_inplace, synchronize

__all__ = ["byteps_hook", "HookState"]


class HookState:
    """What :func:`byteps_hook` can be given as ``state``: a name prefix and BytePS's compression_params.

    ``lr`` returns the learning rate now (error feedback rescales by its
    change); without it the rescaling is 1.
    """

    def __init__(self, prefix: str = "byteps_hook", compression_params: Optional[Dict[str, Any]] = None,
                 lr: Optional[Callable[[], float]] = None) -> None:
        if compression_params and str(compression_params.get("momentum") or "").lower() == "nesterov":
            raise ValueError("compression_params['momentum'] = 'nesterov' needs the optimizer's momentum, which a "
                             "comm hook does not see: use DistributedOptimizer(..., compression_params=...)")
        spec = parse_compression_params(compression_params)
        if spec is not None and spec.fp16:
            raise ValueError("compression_params['fp16']: a comm hook sends the bucket's dtype; use torch's "
                             "fp16_compress_wrapper or DistributedOptimizer for fp16")
        self.prefix = prefix
        self.compression = spec
        self.lr = lr

# torch builds without distributed support have no GradBucket (nor native DDP to hook into).
_GradBucket = torch.distributed.GradBucket if torch.distributed.is_available() else object


def byteps_hook(state: Any, bucket: _GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average ``bucket``'s gradients over all byteps workers, asynchronously.

    ``state`` is None, a string that prefixes the push_pull names (give
    each native DDP model in one process its own), or a :class:`HookState`
    (prefix and compression). Names are built from the bucket's index,
    dtype and size, which torch's DDP keeps identical on every rank (bucket
    layouts are agreed from rank 0), so every rank declares the same tensors.
    """
    buffer = bucket.buffer()
    settings = state if isinstance(state, HookState) else HookState(prefix=state or "byteps_hook")
    dtype = str(buffer.dtype).replace("torch.", "")
    name = f"{settings.prefix}.bucket{bucket.index()}.{dtype}.{buffer.numel()}"
    future: torch.futures.Future = torch.futures.Future()
    lr = settings.lr() if settings.lr is not None and settings.compression is not None else None
    handle = push_pull_async_inplace(buffer, average=True, name=name, compression_spec=settings.compression, lr=lr)

    def complete() -> None:
        # Runs on byteps' communication thread once the push_pull is done;
        # synchronize() returns at once then, or raises the push_pull's error.
        try:
            future.set_result(synchronize(handle))
        except Exception as exc:  # handed to DDP, which raises it in backward()
            future.set_exception(exc)

    handle_done_callback(handle, complete)
    return future
