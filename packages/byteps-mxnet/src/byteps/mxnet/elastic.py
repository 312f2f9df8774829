"""``hvd.elastic`` under MXNet: not there, and saying so.

Horovod has no elastic training for MXNet, and neither does byteps: there is
no state class that saves, restores and syncs a Gluon net and its trainer.
A Horovod-style elastic script that imports ``byteps.mxnet`` fails at its
first use of ``hvd.elastic`` with an error naming what to do instead.
"""

from __future__ import annotations

from typing import Any

__all__: list = []

#: What every attribute of this module answers.
NOT_BUILT = ("byteps.mxnet has no elastic training (Horovod's MXNet has none either): "
             "restart the whole job instead, bpslaunch --max-restarts N with a checkpoint, "
             "or use byteps.torch.elastic / byteps.tensorflow.elastic (docs/elastic.md)")


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotImplementedError(f"byteps.mxnet.elastic.{name}: {NOT_BUILT}")
