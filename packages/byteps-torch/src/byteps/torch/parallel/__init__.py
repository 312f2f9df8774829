"""Data-parallel modules over byteps.

- :class:`DistributedDataParallel`: torch's DDP interface, gradients
  averaged through byteps; no torch.distributed process group needed.
- :func:`byteps_hook`: a communication hook for torch's own
  ``torch.nn.parallel.DistributedDataParallel``
  (``model.register_comm_hook(state=None, hook=byteps_hook)``).
"""

from byteps.torch.parallel.comm_hook import byteps_hook
from byteps.torch.parallel.distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel", "byteps_hook"]
