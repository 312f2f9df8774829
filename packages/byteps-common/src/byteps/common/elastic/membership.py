"""Membership epochs: who is in an elastic job now, and how to join it.

Under ``bpslaunch --min-np/--max-np`` the launcher runs the job as a series
of membership epochs. Each epoch has its own scheduler and servers, on a new
port, with a new job id and secret, so a process still holding an older
epoch's address fails authentication instead of being summed. The launcher
describes the current epoch in one file, ``epoch.json`` in a private folder
(``BYTEPS_ELASTIC_DIR``, mode 0700, since the file holds the job secret);
each worker process knows itself by ``BYTEPS_ELASTIC_WORKER``, a name that
stays the same across epochs, and finds its rank as its place in
``members``. Survivors keep their order, so the lowest surviving rank
becomes rank 0 and new workers come last: the state a new epoch starts from
is always broadcast from a worker that held it.

``pending`` says the launcher has workers waiting to be let in: at their
next ``state.commit()`` the members leave the epoch together
(``HostsUpdatedInterrupt``), each saying so with an empty file
``leaving.<epoch>.<worker>`` (:func:`announce_leaving`), and once all
have, the next epoch includes the newcomers. A member that finishes
instead never announces, and the launcher lets the job end.

Example::

    epoch = Epoch(number=1, members=("w0", "w2"), root_port=40211, num_server=1,
                  job_id="9f1c2a", secret="...", pending=False)
    write_epoch(folder, epoch)
    read_epoch(folder).rank_of("w2")      # 1
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Dict, Optional, Set, Tuple

__all__ = ["Epoch", "write_epoch", "read_epoch", "wait_for_epoch", "update_pending", "epoch_ended", "announce_leaving",
           "leaving_members", "EPOCH_FILE",
           "ELASTIC_DIR", "ELASTIC_WORKER"]

log = logging.getLogger("byteps.common.elastic")

EPOCH_FILE = "epoch.json"
#: The variables bpslaunch gives an elastic worker (docs/configuration.md).
ELASTIC_DIR = "BYTEPS_ELASTIC_DIR"
ELASTIC_WORKER = "BYTEPS_ELASTIC_WORKER"
_POLL_S = 0.05
_REPORT_EVERY_S = 10.0


@dataclasses.dataclass(frozen=True)
class Epoch:
    """One membership epoch: its members in rank order and where its scheduler listens."""

    number: int
    members: Tuple[str, ...]
    root_port: int
    num_server: int
    job_id: str
    secret: str
    root_uri: str = "127.0.0.1"
    pending: bool = False  # workers wait to be let in at the members' next commit

    def rank_of(self, worker: str) -> Optional[int]:
        try:
            return self.members.index(worker)
        except ValueError:
            return None

    def environment(self, worker: str) -> Dict[str, str]:
        """The variables that place ``worker`` in this epoch's job (it must be a member)."""
        rank = self.rank_of(worker)
        if rank is None:
            raise ValueError(f"{worker!r} is not a member of membership epoch {self.number}")
        size = len(self.members)
        return {
            "DMLC_PS_ROOT_URI": self.root_uri, "DMLC_PS_ROOT_PORT": str(self.root_port),
            "DMLC_NUM_WORKER": str(size), "DMLC_NUM_SERVER": str(self.num_server),
            "DMLC_WORKER_ID": str(rank), "BYTEPS_LOCAL_RANK": "0", "BYTEPS_LOCAL_SIZE": "1",
            "BYTEPS_JOB_ID": self.job_id, "BYTEPS_JOB_SECRET": self.secret,
            # As horovodrun sets them: each elastic worker process is a host of one slot.
            "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(size), "HOROVOD_LOCAL_RANK": "0",
            "HOROVOD_LOCAL_SIZE": "1", "HOROVOD_CROSS_RANK": str(rank), "HOROVOD_CROSS_SIZE": str(size),
        }


def write_epoch(folder: os.PathLike, epoch: Epoch) -> None:
    """Publish ``epoch`` atomically (readers see the old file or the new one, never half of one)."""
    folder = Path(folder)
    temporary = folder / f".{EPOCH_FILE}.{os.getpid()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(dataclasses.asdict(epoch), out)
    os.replace(temporary, folder / EPOCH_FILE)


def read_epoch(folder: os.PathLike) -> Optional[Epoch]:
    """The published epoch, or None before the first one."""
    try:
        data = json.loads((Path(folder) / EPOCH_FILE).read_text())
    except FileNotFoundError:
        return None
    data["members"] = tuple(data["members"])
    return Epoch(**data)


def wait_for_epoch(folder: os.PathLike, worker: str, after: int) -> Epoch:
    """Block until an epoch numbered above ``after`` counts ``worker`` among its members.

    A worker waits here when it starts, and again after leaving an epoch.
    No time limit: bpslaunch lets the worker in, stops it, or ends the job
    (and a worker dies with its bpslaunch, by its parent-death signal).
    Logs every 10 s what it waits for.
    """
    started = reported = time.monotonic()
    while True:
        epoch = read_epoch(folder)
        if epoch is not None and epoch.number > after and epoch.rank_of(worker) is not None:
            return epoch
        now = time.monotonic()
        if now - reported > _REPORT_EVERY_S:
            reported = now
            log.warning("elastic worker %s still waits for a membership epoch after %d (%.0f s so far)",
                        worker, after, now - started)
        time.sleep(_POLL_S)


def epoch_ended(folder: os.PathLike, number: int) -> Optional[str]:
    """Why epoch ``number`` is over (bpslaunch published a later one), or None while it is current."""
    epoch = read_epoch(folder)
    if epoch is not None and epoch.number != number:
        return f"bpslaunch ended membership epoch {number} (epoch {epoch.number} is current)"
    return None


def update_pending(folder: os.PathLike, number: int) -> bool:
    """True when epoch ``number`` is over or has workers waiting to be let in."""
    epoch = read_epoch(folder)
    return epoch is not None and (epoch.number != number or epoch.pending)


def announce_leaving(folder: os.PathLike, worker: str, number: int) -> None:
    """Say that ``worker`` leaves epoch ``number`` for the next one (not that it finished)."""
    (Path(folder) / f"leaving.{number}.{worker}").touch()


def leaving_members(folder: os.PathLike, number: int) -> Set[str]:
    """The workers that announced leaving epoch ``number`` for the next one."""
    prefix = f"leaving.{number}."
    return {name[len(prefix):] for name in os.listdir(folder) if name.startswith(prefix)}
