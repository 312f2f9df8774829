"""Checkpoints that a restarted job resumes from (bpslaunch --max-restarts, docs/reliability.md).

The protocol, the same in every adapter: rank 0 writes the checkpoint, and
writes it atomically (a temporary file in the same folder, flushed to disk,
then renamed over the old one), so a job killed in the middle of a save
still finds the previous checkpoint whole. On (re)start every rank calls
the adapter's ``load_checkpoint``: rank 0 reads the file if there is one
and the others receive its contents through broadcasts, so the folder need
not be shared between machines.
"""

from __future__ import annotations

import os
import tempfile
from typing import IO, Callable

__all__ = ["write_atomically", "CHECKPOINT_FILE"]

#: The file in a checkpoint folder.
CHECKPOINT_FILE = "checkpoint"


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
