"""Data-parallel modules over byteps.

- :class:`DistributedDataParallel`: torch's DDP interface, gradients
  averaged through byteps; no torch.distributed process group needed.
- :func:`byteps_hook`: a communication hook for torch's own
  ``torch.nn.parallel.DistributedDataParallel``
  (``model.register_comm_hook(state=None, hook=byteps_hook)``), with
  :class:`HookState` for BytePS's gradient compression of the buckets.
"""

from byteps.torch.parallel.comm_hook import HookState, byteps_hook
from byteps.torch.parallel.distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel", "HookState", "byteps_hook"]
