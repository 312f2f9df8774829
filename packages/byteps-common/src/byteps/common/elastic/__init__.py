"""Elastic training, framework-neutral: membership epochs, the state a job keeps, and the retry loop.

The adapters bind these to their frameworks (``byteps.torch.elastic``):
Horovod's ``hvd.elastic.run``, ``State``/``ObjectState``,
``HostsUpdatedInterrupt`` and ``HorovodInternalError``. docs/elastic.md has
the whole design.
"""

from byteps.common.elastic.membership import Epoch, read_epoch, update_pending, wait_for_epoch, write_epoch
from byteps.common.elastic.run import run_fn
from byteps.common.elastic.state import HostsUpdatedInterrupt, ObjectState, State

__all__ = ["Epoch", "read_epoch", "write_epoch", "wait_for_epoch", "update_pending",
           "State", "ObjectState", "HostsUpdatedInterrupt", "run_fn"]
