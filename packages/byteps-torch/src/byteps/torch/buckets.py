"""Which gradients travel fused, and in which bucket: decided from the parameters alone.

Used by :func:`~byteps.torch.DistributedOptimizer` and
:class:`~byteps.torch.parallel.DistributedDataParallel`. Small gradients
(at most BYTEPS_FUSION_MAX_TENSOR_BYTES) are packed, in parameter order,
into buckets of at most BYTEPS_FUSION_THRESHOLD bytes by byteps-common's
planner (:func:`byteps.common.fusion.plan_fusion`); a wrapper push_pulls a
bucket as one buffer once its last gradient is ready (as torch DDP does),
so hundreds of tiny gradients cost a few messages. The buckets depend only
on the parameters (order, sizes, dtypes, which are active), never on timing,
so every rank builds the same ones. BYTEPS_FUSION_THRESHOLD=0 sends every
gradient alone.

Buckets never mix devices. A bucket of host gradients goes through the
front's fusion (packed into a host buffer); a bucket of CUDA gradients is
packed on the device (one ``torch.cat``) and push_pulled as one CUDA tensor,
staged partition by partition (:func:`push_pull_bucket`, docs/gpu.md).

Example::

    buckets = GradientBuckets({p: f"Gradient.{name}" for name, p in model.named_parameters()}, Compression.none)
    buckets.declare(buckets.plan(active))          # ids in parameter order, the same on every rank
    bucket = buckets.plan(active).get(p)           # None: p goes alone
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

import torch

from byteps.common import api
from byteps.common.fusion import FusionGroup, plan_fusion
from byteps.torch.group_ops import push_pull_group_async
from byteps.torch.ops import declare, push_pull_async_inplace, synchronize
from byteps.torch.tensors import byteps_dtype

__all__ = ["Bucket", "GradientBuckets", "push_pull_bucket", "wait_gradient"]


class Bucket:
    """Small gradients push_pulled as one fused buffer once all of them are ready.

    ``name`` is the fused buffer's push_pull name (it encodes the members,
    so ranks whose buckets differ get a mismatch error, not a wrong sum).
    """

    def __init__(self, group: FusionGroup, members: List[torch.Tensor]) -> None:
        self.group = group
        self.name = group.name
        self.members = members
        self.ready: Set[torch.Tensor] = set()
        self.started = False

    def add_ready(self, p: torch.Tensor) -> bool:
        """Mark ``p``'s gradient ready; True when that completes the bucket."""
        self.ready.add(p)
        return len(self.ready) == len(self.members)

    def reset(self) -> None:
        self.ready.clear()
        self.started = False


class GradientBuckets:
    """The bucket plans of one wrapper: per set of active parameters, cached."""

    def __init__(self, names: Dict[torch.Tensor, str], compression: Any,
                 compressed: Callable[[int], bool] = lambda nbytes: False,
                 lr_group: Callable[[torch.Tensor], int] = lambda p: 0) -> None:
        self.names = names            # parameter -> its gradient's push_pull name
        self.compression = compression
        self.compressed = compressed  # whether a gradient of these wire bytes goes compressed (compression_params)
        self.lr_group = lr_group      # compressed gradients share a bucket only within one learning rate's group
        config = api.worker().config
        self._limits = (config.fusion_threshold, config.fusion_max_tensor_bytes, config.partition_bytes)
        #: the plans made so far, by the ids of their active parameters
        self.plans: Dict[Tuple[int, ...], Dict[torch.Tensor, Bucket]] = {}

    def plan(self, active: List[torch.Tensor]) -> Dict[torch.Tensor, Bucket]:
        """Parameter -> its bucket, over ``active`` (in parameter order); parameters not in it go alone.

        The first plan is declared by :meth:`declare`; later ones (after
        parameters were frozen or unfrozen) declare their buckets here.
        """
        key = tuple(id(p) for p in active)
        found = self.plans.get(key)
        if found is None:
            found = self.plans[key] = self._plan_buckets(active, declare_now=bool(self.plans))
        return found

    def _plan_buckets(self, active: List[torch.Tensor], declare_now: bool) -> Dict[torch.Tensor, Bucket]:
        threshold, max_tensor_bytes, partition_bytes = self._limits
        if threshold == 0:
            return {}
        # Buckets never mix devices; compressed gradients (each compressed alone inside a bucket of one
        # partition; on the host only) share one only with gradients of the same learning rate.
        classes: Dict[Tuple[torch.device, Optional[int]], Tuple[list, list, list]] = {}
        for p in active:
            layout = self._wire_layout(p)
            if layout is not None:
                compressed = self.compressed(layout[0])
                items, params, flags = classes.setdefault((p.device, self.lr_group(p) if compressed else None),
                                                          ([], [], []))
                items.append((self.names[p], *layout))
                params.append(p)
                flags.append(compressed)
        plan: Dict[torch.Tensor, Bucket] = {}
        for (device, _), (items, params, flags) in classes.items():
            for group in plan_fusion(items, threshold, max_tensor_bytes, flags,
                                     partition_bytes if device.type == "cpu" else 0):
                if group.fused:
                    if declare_now:
                        api.declare(group.name, nbytes=group.nbytes, itemsize=group.dtype.itemsize)
                    bucket = Bucket(group, [params[i] for i in group.members])
                    plan.update((p, bucket) for p in bucket.members)
        return plan

    def _wire_layout(self, p: torch.Tensor) -> Optional[Tuple[int, Any]]:
        """(bytes, byteps dtype) of what ``p``'s gradient is sent as; None when the compressor does not say."""
        try:
            sent, _ = self.compression.compress(torch.empty(p.shape, dtype=p.dtype, device="meta"))
            return sent.numel() * sent.element_size(), byteps_dtype(sent.dtype, "gradient")
        except Exception:  # a compressor that cannot run on meta tensors: its gradients go alone
            return None

    @staticmethod
    def start_unsent(plan: Dict[torch.Tensor, Bucket], params: Iterable[torch.Tensor],
                     start_alone: Callable[[torch.Tensor], None], start_bucket: Callable[[Bucket], None]) -> None:
        """At the end of a step, start what is still unsent among ``params``.

        A parameter unused here may have been used on another rank, and every
        rank must push the same names: a lone gradient goes alone, a bucket
        not started yet goes with zeros for its missing gradients.
        """
        for p in params:
            bucket = plan.get(p)
            if bucket is None:
                start_alone(p)
            elif not bucket.started:
                start_bucket(bucket)

    @staticmethod
    def reset(plan: Dict[torch.Tensor, Bucket]) -> None:
        """Forget which gradients were ready (after a step)."""
        for bucket in set(plan.values()):
            bucket.reset()

    def declare(self, plan: Dict[torch.Tensor, Bucket]) -> None:
        """Give every push_pull an id now, in parameter order, the same on every rank.

        Ids come from declaration order, and the scheduler sends earlier ids
        first: a bucket is declared just before its first member, so it goes
        with the front layers it serves. A gradient that is sent alone is
        declared with the size it sends (so the servers' load can be
        balanced); a fused one without (it is normally never sent alone, and
        its bytes are counted in its bucket's).
        """
        for p, name in self.names.items():
            bucket = plan.get(p)
            if bucket is None:
                declare(name, p, self.compression)
                continue
            if bucket.members[0] is p:
                api.declare(bucket.name, nbytes=bucket.group.nbytes, itemsize=bucket.group.dtype.itemsize)
            declare(name)


class _DevicePack:
    """A bucket's CUDA gradients packed into one CUDA buffer, push_pulled as one tensor."""

    def __init__(self, buffers: List[torch.Tensor]) -> None:
        self.buffer = torch.cat([b.reshape(-1) for b in buffers])
        pieces = torch.split(self.buffer, [b.numel() for b in buffers])
        self.members = [piece.view(b.shape) for piece, b in zip(pieces, buffers)]  # views of ``buffer``
        self.handle: Optional[int] = None
        self._done = False

    def member(self, index: int) -> torch.Tensor:
        if not self._done:
            synchronize(self.handle)
            self._done = True
        return self.members[index]


class _PackedGradient:
    """One member's handle in a device-packed bucket (see :func:`wait_gradient`)."""

    def __init__(self, pack: _DevicePack, index: int) -> None:
        self.pack = pack
        self.index = index


def push_pull_bucket(bucket: Bucket, buffers: List[torch.Tensor], average: bool, names: List[str],
                     compression_spec: Any = None, lr: Optional[float] = None) -> List[Any]:
    """Start ``bucket``'s push_pull of its members' ``buffers``; one handle per member, for :func:`wait_gradient`.

    Host gradients go through the front's fusion (``names`` are theirs; a
    compressed bucket's members each compressed alone, with
    ``compression_spec`` and ``lr``); CUDA gradients are packed on the
    device into one buffer named after the bucket, so the bucket is one
    staged push_pull, not one per gradient.
    """
    if buffers[0].device.type != "cuda":
        return push_pull_group_async(buffers, average=average, names=names, compression_spec=compression_spec,
                                     lr=lr)
    pack = _DevicePack(buffers)
    pack.handle = push_pull_async_inplace(pack.buffer, average=average, name=bucket.name)
    return [_PackedGradient(pack, index) for index in range(len(buffers))]


def wait_gradient(handle: Any) -> torch.Tensor:
    """The result behind a gradient's handle: an int handle, or a member of a device-packed bucket."""
    if isinstance(handle, _PackedGradient):
        return handle.pack.member(handle.index)
    return synchronize(handle)

