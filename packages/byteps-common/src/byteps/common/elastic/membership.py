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

Workers read the epoch from a **board** (:func:`board_from_env`): the
folder itself when they run on bpslaunch's machine (:class:`FolderBoard`),
or bpslaunch's rendezvous service over TCP when they run on other hosts
(:class:`ServiceBoard`, ``BYTEPS_ELASTIC_RENDEZVOUS=host:port``). The
service never sends a secret: each epoch's job secret is derived from the
elastic job's key (``BYTEPS_ELASTIC_KEY``, which reaches a remote worker
inside ssh) and the epoch's job id (:func:`epoch_secret`), every answer is
signed with that key, and every announcement a worker sends is too.

Example::

    epoch = Epoch(number=1, members=("w0", "w2"), root_port=40211, num_server=1,
                  job_id="9f1c2a", secret="...", pending=False)
    write_epoch(folder, epoch)
    read_epoch(folder).rank_of("w2")      # 1
    board_from_env().read().rank_of("w2")  # the same, from where this worker runs
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import logging
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, Mapping, Optional, Protocol, Set, Tuple

__all__ = ["Epoch", "write_epoch", "read_epoch", "wait_for_epoch", "update_pending", "epoch_ended", "announce_leaving",
           "leaving_members", "EPOCH_FILE", "Board", "FolderBoard", "ServiceBoard", "board_from_env",
           "RendezvousError", "RendezvousUnreachable", "epoch_secret", "signature", "public_epoch", "leaving_message",
           "SIGNATURE_HEADER",
           "ELASTIC_DIR", "ELASTIC_WORKER", "ELASTIC_RENDEZVOUS", "ELASTIC_KEY"]

log = logging.getLogger("byteps.common.elastic")

EPOCH_FILE = "epoch.json"
#: The variables bpslaunch gives an elastic worker (docs/configuration.md).
ELASTIC_DIR = "BYTEPS_ELASTIC_DIR"
ELASTIC_WORKER = "BYTEPS_ELASTIC_WORKER"
#: A worker on another host than bpslaunch: where its rendezvous service listens (host:port) ...
ELASTIC_RENDEZVOUS = "BYTEPS_ELASTIC_RENDEZVOUS"
#: ... and the elastic job's key, which signs what the service says and derives each epoch's secret.
ELASTIC_KEY = "BYTEPS_ELASTIC_KEY"
#: The HTTP header that carries a signature (hex HMAC-SHA256) of a rendezvous answer or announcement.
SIGNATURE_HEADER = "X-Byteps-Signature"
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


def wait_for_epoch(board: Board, worker: str, after: int) -> Epoch:
    """Block until an epoch numbered above ``after`` counts ``worker`` among its members.

    A worker waits here when it starts, and again after leaving an epoch.
    No time limit: bpslaunch lets the worker in, stops it, or ends the job
    (and a worker dies with its bpslaunch, by its parent-death signal, or
    over ssh when its session closes). A rendezvous service that does not
    answer is asked again; one that answers with a wrong signature is an
    error. Logs every 10 s what it waits for.
    """
    started = reported = time.monotonic()
    while True:
        try:
            epoch = board.read()
            unreachable = ""
        except RendezvousUnreachable as exc:
            epoch, unreachable = None, f"; {exc}"
        if epoch is not None and epoch.number > after and epoch.rank_of(worker) is not None:
            return epoch
        now = time.monotonic()
        if now - reported > _REPORT_EVERY_S:
            reported = now
            log.warning("elastic worker %s still waits for a membership epoch after %d (%.0f s so far)%s",
                        worker, after, now - started, unreachable)
        time.sleep(_POLL_S if not unreachable else 1.0)


def epoch_ended(board: Board, number: int) -> Optional[str]:
    """Why epoch ``number`` is over (bpslaunch published a later one), or None while it is current.

    Asked by the communication thread about once a second: a board that
    cannot be read within a second counts as "not over" (a bpslaunch that
    is gone ends its workers by other ways).
    """
    try:
        epoch = board.read(timeout_s=1.0)
    except RendezvousError as exc:
        log.debug("cannot ask whether epoch %d is over: %s", number, exc)
        return None
    if epoch is not None and epoch.number != number:
        return f"bpslaunch ended membership epoch {number} (epoch {epoch.number} is current)"
    return None


def update_pending(board: Board, number: int) -> bool:
    """True when epoch ``number`` is over or has workers waiting to be let in (RendezvousError if unknown)."""
    epoch = board.read()
    return epoch is not None and (epoch.number != number or epoch.pending)


def announce_leaving(folder: os.PathLike, worker: str, number: int) -> None:
    """Say that ``worker`` leaves epoch ``number`` for the next one (not that it finished)."""
    (Path(folder) / f"leaving.{number}.{worker}").touch()


def leaving_members(folder: os.PathLike, number: int) -> Set[str]:
    """The workers that announced leaving epoch ``number`` for the next one."""
    prefix = f"leaving.{number}."
    return {name[len(prefix):] for name in os.listdir(folder) if name.startswith(prefix)}


# ---------------------------------------------------------------- keys and signatures


def epoch_secret(key: str, job_id: str) -> str:
    """The job secret of the epoch with ``job_id`` in the elastic job with ``key`` (never sent anywhere)."""
    return hmac.new(key.encode(), f"epoch secret {job_id}".encode(), hashlib.sha256).hexdigest()


def signature(key: str, what: bytes) -> str:
    """Hex HMAC-SHA256 of ``what`` under the elastic job's key."""
    return hmac.new(key.encode(), what, hashlib.sha256).hexdigest()


def public_epoch(epoch: Epoch) -> bytes:
    """What the rendezvous service sends for ``epoch``: everything but the secret, as JSON."""
    data = dataclasses.asdict(epoch)
    del data["secret"]
    return json.dumps(data, sort_keys=True).encode()


def leaving_message(worker: str, number: int) -> bytes:
    """What a worker signs to say it leaves epoch ``number`` for the next one."""
    return f"leaving {number} {worker}".encode()


# ---------------------------------------------------------------- boards: where a worker reads the epoch


class RendezvousError(RuntimeError):
    """The rendezvous service cannot be trusted (a wrong signature), refuses, or does not answer."""


class RendezvousUnreachable(RendezvousError):
    """The rendezvous service does not answer (worth asking again)."""


class Board(Protocol):
    """Where a worker reads the current epoch and says it leaves one."""

    where: str

    def read(self, timeout_s: float = ...) -> Optional[Epoch]:
        """The published epoch, or None before the first; RendezvousError when it cannot be read."""

    def announce_leaving(self, worker: str, number: int) -> None:
        """Say that ``worker`` leaves epoch ``number`` for the next one."""


class FolderBoard:
    """The epoch folder itself: workers on bpslaunch's machine."""

    def __init__(self, folder: os.PathLike) -> None:
        self.folder = folder
        self.where = f"{ELASTIC_DIR}={folder}"

    def read(self, timeout_s: float = 0.0) -> Optional[Epoch]:
        return read_epoch(self.folder)

    def announce_leaving(self, worker: str, number: int) -> None:
        announce_leaving(self.folder, worker, number)


class ServiceBoard:
    """bpslaunch's rendezvous service (``host:port``): workers on other hosts.

    ``GET /epoch`` answers the epoch without its secret, signed; the secret
    is derived here from the key. ``POST /leaving/<epoch>/<worker>`` carries
    the signed announcement. A wrong signature is a RendezvousError naming
    the key; so is a service that does not answer within ``timeout_s``.
    """

    def __init__(self, address: str, key: str) -> None:
        self.address, self.key = address, key
        self.where = f"bpslaunch's rendezvous service at {address} ({ELASTIC_RENDEZVOUS})"

    def _request(self, method: str, path: str, body: bytes, timeout_s: float) -> Tuple[int, bytes, str]:
        request = urllib.request.Request(f"http://{self.address}{path}", data=body if method == "POST" else None,
                                         method=method, headers={SIGNATURE_HEADER: signature(self.key, body)})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as answer:
                return answer.status, answer.read(), answer.headers.get(SIGNATURE_HEADER, "")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read(), ""
        except (OSError, urllib.error.URLError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RendezvousUnreachable(f"{self.where} does not answer: {reason}") from None

    def read(self, timeout_s: float = 5.0) -> Optional[Epoch]:
        status, body, signed = self._request("GET", "/epoch", b"", timeout_s)
        if status == 404:
            return None
        if status != 200:
            raise RendezvousError(f"{self.where} answered {status}: {body[:200].decode(errors='replace')}")
        if not hmac.compare_digest(signed, signature(self.key, body)):
            raise RendezvousError(f"{self.where} answered with a wrong signature: this worker's {ELASTIC_KEY} is "
                                  "not the key of the bpslaunch that serves it (a worker of another job?)")
        data = json.loads(body)
        data["members"] = tuple(data["members"])
        data["secret"] = epoch_secret(self.key, data["job_id"])
        return Epoch(**data)

    def announce_leaving(self, worker: str, number: int) -> None:
        status, body, _ = self._request("POST", f"/leaving/{number}/{worker}", leaving_message(worker, number), 10.0)
        if status != 204:
            raise RendezvousError(f"{self.where} refused {worker} leaving epoch {number} ({status}: "
                                  f"{body[:200].decode(errors='replace')})")


def board_from_env(environ: Mapping[str, str] = os.environ) -> Optional[Board]:
    """This worker's board; None outside an elastic job. ValueError naming a variable that is missing."""
    folder = environ.get(ELASTIC_DIR, "").strip()
    address = environ.get(ELASTIC_RENDEZVOUS, "").strip()
    if not folder and not address:
        return None
    if not environ.get(ELASTIC_WORKER, "").strip():
        given = ELASTIC_DIR if folder else ELASTIC_RENDEZVOUS
        raise ValueError(f"{given} is set but {ELASTIC_WORKER} is not: elastic workers are started by bpslaunch "
                         "--min-np/--max-np")
    if folder:
        return FolderBoard(folder)
    key = environ.get(ELASTIC_KEY, "").strip()
    if not key:
        raise ValueError(f"{ELASTIC_RENDEZVOUS} is set but {ELASTIC_KEY} is not: elastic workers on other hosts "
                         "are started by bpslaunch, which gives them both")
    return ServiceBoard(address, key)
