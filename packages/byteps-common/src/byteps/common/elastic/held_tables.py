"""Server-held tables across membership epochs: saved at every commit, loaded into each epoch's fresh servers.

A table held by the servers (docs/sparse.md) lives in the servers' memory,
and each membership epoch of an elastic job has fresh, empty servers
(docs/elastic.md). So an elastic job saves its held tables at every
``state.commit()`` and loads them at the start of every epoch, before the
training function runs again: a lost worker, a lost server and a change of
membership all go on from the tables as they were at the last commit, as
the dense parameters do.

- **Where**: ``BYTEPS_HELD_TABLE_DIR``, a folder on the servers' machine
  (bpslaunch's, in elastic mode; bpslaunch sets it to a folder of its own
  that it removes at the end, unless the job sets one). Two slots,
  ``slot-0`` and ``slot-1``, used in turn: a commit writes the slot the last
  one did not, so a save cut short by a lost process leaves the last whole
  one in place, and the disk holds at most two copies of each table.
- **A commit**: every rank waits until its last update of every held table
  is applied, all ranks meet (a broadcast), rank 0 asks the servers to save
  every held table it declared into the next slot, and the outcome (the
  slot and the tables, or why the save failed) goes to every rank by
  another broadcast: all ranks raise alike.
- **An epoch's start**: rank 0 sends every rank the last commit's slot and
  tables (a newcomer has none of its own), and asks the new servers to load
  each table from it; every rank learns the outcome.

Nothing is sent in a job with no held table, nor outside elastic jobs.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Optional

from byteps.common.frontend.checkpoint import load_tables, save_tables
from byteps.common.held_table import HeldTable

__all__ = ["HELD_TABLE_DIR", "HeldTableCommits"]

#: The folder, on the servers' machine, where an elastic job's held tables are saved at each commit.
HELD_TABLE_DIR = "BYTEPS_HELD_TABLE_DIR"


class HeldTableCommits:
    """The held tables of an elastic state, as of its last commit: ``commit`` saves them, ``load`` brings them
    into the current epoch's servers.

    ``bcast_object(obj)`` broadcasts from rank 0 over every rank (the adapter's ``broadcast_object``) and
    ``get_rank()`` is this process's rank.
    """

    def __init__(self, bcast_object: Callable[..., Any], get_rank: Callable[[], int]) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self.committed: Optional[Dict[str, Any]] = None  # {"slot": k, "tables": [[name, rows, shape, held]...]}

    def commit(self) -> None:
        """Every rank, at ``state.commit()`` of an elastic job: the held tables saved into the next slot."""
        from byteps.common import api

        if api.membership_epoch() is None:
            return
        worker = api.worker()
        worker.sparse.wait_for_updates()
        tables = worker.sparse.held_tables() if self._rank() == 0 else []
        if not self._bcast_object(bool(tables)):  # every rank here: each one's updates are applied
            return
        outcome: Dict[str, Any] = {}
        if self._rank() == 0:
            slot = 0 if self.committed is None else 1 - self.committed["slot"]
            try:
                save_tables(self._slot(slot), [(t.name, t.num_rows, t.row_shape, t.held) for t in tables])
                outcome = {"slot": slot, "tables": [[t.name, t.num_rows, list(t.row_shape), t.held.wire()]
                                                    for t in tables]}
            except Exception as exc:  # noqa: BLE001 - every rank raises it, after the broadcast
                outcome = {"error": f"elastic commit: saving the server-held tables failed on rank 0: {exc}"}
        outcome = self._bcast_object(outcome)
        if "error" in outcome:
            raise RuntimeError(outcome["error"])
        self.committed = outcome

    def load(self) -> None:
        """Every rank, when an epoch starts (before the training function runs again): the last commit's tables
        into this epoch's servers. Nothing before the first commit that saved one."""
        from byteps.common import api

        if api.membership_epoch() is None:
            return
        self.committed = self._bcast_object(self.committed)
        if self.committed is None:
            return
        error = None
        if self._rank() == 0:
            try:
                load_tables(self._slot(self.committed["slot"]),
                            [(name, num_rows, tuple(row_shape), HeldTable.from_wire(held))
                             for name, num_rows, row_shape, held in self.committed["tables"]])
            except Exception as exc:  # noqa: BLE001 - every rank raises it, after the broadcast
                error = f"elastic: loading the server-held tables of the last commit failed on rank 0: {exc}"
        error = self._bcast_object(error)
        if error is not None:
            raise RuntimeError(error)

    @staticmethod
    def _slot(slot: int) -> str:
        folder = os.environ.get(HELD_TABLE_DIR, "").strip()
        if not folder:
            raise ValueError(f"{HELD_TABLE_DIR} is not set: an elastic job with tables held by the servers saves "
                             "them there at each commit (bpslaunch sets it; set it to a folder on the servers' "
                             "machine)")
        return os.path.join(folder, f"slot-{slot}")
