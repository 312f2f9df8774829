"""Checkpoints that a restarted job resumes from (bpslaunch --max-restarts, docs/reliability.md).

The protocol, the same in every adapter: rank 0 writes the checkpoint, and
writes it atomically (a temporary file in the same folder, flushed to disk,
then renamed over the old one), so a job killed in the middle of a save
still finds the previous checkpoint whole. On (re)start every rank calls
the adapter's ``load_checkpoint``: rank 0 reads the file if there is one
and the others receive its contents through broadcasts, so the folder need
not be shared between machines.

Tables held by the servers (docs/sparse.md) are in no worker's memory: rank
0 asks the servers to save them into a new folder of
``<checkpoint folder>/held-tables/`` before it writes the checkpoint, which
names that folder; once the checkpoint is in place, the older folders are
removed. A job killed at any point still has a checkpoint whose tables are
whole. The servers write and read those folders, so the checkpoint folder
must be the same path on the servers' machines (one machine, or a shared
file system); a restarted job's fresh servers load the tables before any
rank looks a row up.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from typing import IO, Any, Callable, Optional, Sequence, Tuple

__all__ = ["write_atomically", "CHECKPOINT_FILE", "HELD_TABLES", "save_held_tables", "load_held_tables",
           "drop_older_held_tables", "save_tables", "load_tables"]

#: The file in a checkpoint folder.
CHECKPOINT_FILE = "checkpoint"
#: The folder of a checkpoint folder where the servers save the held tables (one sub-folder per save).
HELD_TABLES = "held-tables"

#: A held table as a checkpoint saves it: (name, num_rows, row_shape, HeldTable).
HeldTableSpec = Tuple[str, int, Tuple[int, ...], Any]


def write_atomically(path: str, write: Callable[[IO[bytes]], None]) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, then put it in ``path``'s place in one step."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".checkpoint-", dir=folder)
    try:
        with os.fdopen(handle, "wb") as out:
            write(out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise


def save_tables(folder: str, tables: Sequence[HeldTableSpec]) -> None:
    """One rank: the servers save each of ``tables`` into ``folder`` on their machines (a checkpoint's, an
    elastic commit's)."""
    from byteps.common import api

    for table, num_rows, row_shape, held in tables:
        api.worker().table_save(folder, table, num_rows, row_shape, held)


def load_tables(folder: str, tables: Sequence[HeldTableSpec]) -> None:
    """One rank: the servers load each of ``tables`` from ``folder``, as any number of servers saved it."""
    from byteps.common import api

    for table, num_rows, row_shape, held in tables:
        api.worker().table_load(folder, table, num_rows, row_shape, held)


def save_held_tables(directory: str, tables: Sequence[HeldTableSpec], step: int) -> Optional[str]:
    """Rank 0, its last update of each table applied: the servers save ``tables`` into a new folder of
    ``<directory>/held-tables``; returns its name for the checkpoint (None when there are no tables)."""
    if not tables:
        return None

    name = f"step-{int(step)}-{uuid.uuid4().hex[:8]}"
    save_tables(os.path.join(directory, HELD_TABLES, name), tables)
    return name


def load_held_tables(directory: str, saved: Optional[str], tables: Sequence[HeldTableSpec]) -> None:
    """Rank 0: the servers load ``tables`` from the save ``saved`` names (a checkpoint's; None: nothing)."""
    if saved is not None:
        load_tables(os.path.join(directory, HELD_TABLES, saved), tables)


def drop_older_held_tables(directory: str, keep: Optional[str]) -> None:
    """Rank 0, once the checkpoint naming ``keep`` is in place: every other save of held tables removed (where
    this machine sees the servers' folder; elsewhere nothing is removed)."""
    folder = os.path.join(directory, HELD_TABLES)
    if keep is None or not os.path.isdir(folder):
        return
    for entry in os.listdir(folder):
        if entry != keep:
            shutil.rmtree(os.path.join(folder, entry), ignore_errors=True)
