"""What an elastic job keeps across a change of membership: Horovod's ``State`` and ``ObjectState``.

A state is saved in memory at ``commit()``, rolled back to that save with
``restore()`` after a lost process, and sent from rank 0 to every rank with
``sync()`` when a membership epoch starts. ``commit()`` also asks whether
the launcher has workers waiting to be let in: rank 0 reads it and every
rank learns the answer by one broadcast, so all ranks raise
:class:`HostsUpdatedInterrupt` at the same commit.

Example::

    state = ObjectState(broadcast_object, rank, epoch=0, batch=0)
    state.batch = 7
    state.commit()        # saved; raises HostsUpdatedInterrupt when workers wait to join
    state.batch = 9
    state.restore()       # state.batch == 7 again
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Callable, Dict, Iterable, List

from byteps.common.elastic.held_tables import HeldTableCommits

__all__ = ["State", "ObjectState", "HostsUpdatedInterrupt"]

log = logging.getLogger("byteps.common.elastic")


class HostsUpdatedInterrupt(RuntimeError):
    """The job's membership changes at this commit: every rank leaves the epoch and joins the next.

    ``skip_sync`` is True when no worker joins (only removals), so the
    states the ranks hold are already the same and need no broadcast.
    """

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("the job's membership changes: leaving this epoch for the next one")
        self.skip_sync = skip_sync


class State:
    """The base of elastic states: ``save``, ``restore``, ``sync`` and ``reset`` are the subclass's."""

    def __init__(self, bcast_object: Callable[..., Any], get_rank: Callable[[], int]) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks: List[Callable[[], None]] = []
        self._held_tables = HeldTableCommits(bcast_object, get_rank)

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Call each of ``callbacks`` (no arguments) after every change of membership, e.g. to rescale the lr."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save the state; then raise HostsUpdatedInterrupt on every rank if workers wait to join.

        In asynchronous training (BYTEPS_ENABLE_ASYNC=1) every rank first
        takes the servers' parameters, which by then hold every delta pushed
        before this commit, so each rank saves the same parameters and a
        rollback to them drops exactly the deltas pushed after it
        (:func:`byteps.common.frontend.async_training.commit_exchanges`).
        Tables held by the servers are saved on the servers' machine
        (:mod:`byteps.common.elastic.held_tables`), since each epoch's servers
        start empty.
        """
        # Imported here: byteps.common.api imports this package, and the front imports api.
        from byteps.common.frontend.async_training import commit_exchanges

        commit_exchanges()
        self._held_tables.commit()
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise HostsUpdatedInterrupt on every rank together when the launcher has workers waiting.

        Outside an elastic job (no membership epoch) there is nothing to ask and nothing is sent.
        """
        from byteps.common import api
        from byteps.common.elastic.membership import RendezvousError, board_from_env, update_pending

        epoch = api.membership_epoch()
        if epoch is None:
            return
        pending = False
        if self._rank() == 0:
            try:
                pending = update_pending(board_from_env(), epoch.number)
            except RendezvousError as exc:  # asked again at the next commit; the other ranks wait on this one
                log.warning("elastic: cannot ask whether workers wait to join: %s", exc)
        if self._bcast_object(bool(pending)):
            raise HostsUpdatedInterrupt(skip_sync=False)

    def load_held_tables(self) -> None:
        """Every rank, as an epoch starts (after ``sync``): the last commit's server-held tables into this epoch's
        fresh servers (nothing before a commit saved one, nor outside elastic jobs)."""
        self._held_tables.load()

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Called after every change of membership, before the reset callbacks; nothing by default."""


class ObjectState(State):
    """Plain Python values as attributes (``state.epoch``, ``state.batch``), saved by copy, synced by broadcast."""

    def __init__(self, bcast_object: Callable[..., Any], get_rank: Callable[[], int], **kwargs: Any) -> None:
        self._saved_state: Dict[str, Any] = dict(kwargs)
        self._set_attrs()
        super().__init__(bcast_object, get_rank)

    def save(self) -> None:
        self._saved_state = {name: copy.deepcopy(getattr(self, name)) for name in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))
