"""Backup workers (BYTEPS_BACKUP_WORKERS) in MXNet: a worker that fell behind skips a round instead of computing it.

With ``b`` backup workers a round of gradient averages closes once all
machines but ``b`` pushed it (docs/async.md). A worker whose last step's
answers say that the next round has already closed without it can take that
round's averages from the servers (a pull without a push), step with them
exactly as the others did, and skip its own batch.
:meth:`byteps.mxnet.DistributedTrainer.skip_step` and
:meth:`byteps.mxnet.DistributedOptimizer.skip_step` do it with the two
steps here:

* :func:`rounds_behind` waits for the last step's push_pulls (MXNet's ops
  return before the network answers, and only a finished push_pull tells
  how many rounds closed after it), then asks byteps-common;
* :func:`skip_round` runs one step of updates with every op it issues
  pulling without a push (:func:`byteps.mxnet.ops.skipping_round`), the
  gradients first marked fresh, since gluon refuses to step with gradients
  no ``backward()`` wrote.

Example (what ``trainer.skip_step(batch_size)`` does)::

    if rounds_behind(grads) > 0:
        skip_round(lambda: trainer.step(batch_size), trainer._params)
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from byteps.common import api
from byteps.mxnet.ops import skipping_round

__all__ = ["rounds_behind", "skip_round"]


def rounds_behind(grads: Iterable[Any]) -> int:
    """How many rounds had closed after this worker's last ones, once the push_pulls writing ``grads`` are done.

    0 without backup workers, in time, or when no push_pull finished since the last call.
    """
    for grad in grads:
        grad.wait_to_read()  # the push_pull's engine op writes the gradient in place
    return api.worker().take_rounds_behind()


def skip_round(step: Callable[[], Any], params: Iterable[Any] = ()) -> None:
    """Run ``step`` (one step of updates) with every op it issues pulling its round's averages without a push.

    ``params``: gluon Parameters whose gradients ``step`` updates with,
    marked fresh first (gluon's Trainer refuses stale gradients), as if a
    ``backward()`` had written them: the pull replaces them with the
    round's averages before the update reads them.
    """
    for param in params:
        if param.grad_req != "null":
            for data in param.list_data():
                data._fresh_grad = True
    with skipping_round():
        step()
