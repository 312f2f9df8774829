"""The retry loop of elastic training (Horovod's ``run_fn``), written once for every adapter.

``run_fn(func, reset)`` wraps a training function ``func(state, ...)``:

* the state is synced from rank 0, then ``func`` runs;
* a lost process (:class:`~byteps.common.handle.JobLost` from any
  collective) rolls the state back to its last commit;
  :class:`HostsUpdatedInterrupt` (workers waiting to join) keeps it as
  committed;
* either way the worker leaves the epoch (without goodbyes after a loss),
  ``reset()`` joins the next one, the state's reset callbacks run, and the
  loop starts again from the sync.

Any other error, including a refusal such as ranks that disagree (which a
new epoch would only repeat), ends the loop and reaches the caller. How
many changes a job may go through is the launcher's ``--reset-limit``.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import Any, Callable

from byteps.common.elastic.membership import ELASTIC_WORKER, board_from_env, epoch_ended
from byteps.common.elastic.state import HostsUpdatedInterrupt, State
from byteps.common.handle import JobLost

__all__ = ["run_fn", "rejoin"]

log = logging.getLogger("byteps.common.elastic")


def rejoin(lost: bool) -> None:
    """Leave this epoch (abandoning it after a loss, else saying goodbye) and join the next one.

    Every adapter's state (handles, names, process sets) is reset by the
    front's shutdown hooks, and rebuilt by its init hooks.
    """
    from byteps.common import api
    from byteps.common.frontend import process

    epoch = api.membership_epoch()
    board = board_from_env() if epoch is not None else None
    # An epoch bpslaunch already ended (its scheduler may be dead) gets no goodbyes either.
    ended = epoch is not None and epoch_ended(board, epoch.number) is not None
    process.shutdown()
    if lost or ended:
        api.abandon()
    else:
        api.shutdown()
        if epoch is not None:  # tells bpslaunch this worker goes on (a finished one exits instead)
            board.announce_leaving(os.environ[ELASTIC_WORKER], epoch.number)
    process.init()


def run_fn(func: Callable[..., Any], reset: Callable[[bool], None] = rejoin) -> Callable[..., Any]:
    """``func(state, ...)`` retried across membership changes; ``reset(lost)`` moves to the next epoch."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                state.load_held_tables()  # this epoch's servers start empty
                return func(state, *args, **kwargs)
            except JobLost as exc:
                log.warning("elastic: the job lost a process (%s); rolling back to the last commit", exc)
                started = time.monotonic()
                state.restore()
                lost, skip_sync = True, False
            except HostsUpdatedInterrupt as exc:
                log.info("elastic: the membership changes at this commit")
                started = time.monotonic()
                lost, skip_sync = False, exc.skip_sync
            reset(lost)
            state.on_reset()
            from byteps.common import api
            epoch = api.membership_epoch()
            log.warning("elastic: rank %d of %d in membership epoch %s, %.2f s after leaving the last one",
                        api.rank(), api.size(), epoch.number if epoch else "-", time.monotonic() - started)

    return wrapper
