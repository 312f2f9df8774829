"""The rendezvous service of an elastic job over several hosts: the epoch folder, served over TCP.

Elastic workers on bpslaunch's own machine read the membership epoch from
a private folder (:mod:`byteps.common.elastic.membership`). Workers on
other hosts cannot, so bpslaunch serves that folder over HTTP on one
address (the one its machine uses toward the worker hosts, never
0.0.0.0), in a thread of its own:

* ``GET /epoch``: the current epoch as JSON *without* its secret (a worker
  derives it from the elastic key), signed with the key in the
  ``X-Byteps-Signature`` header; 404 before the first epoch;
* ``POST /leaving/<epoch>/<worker>``: the worker leaves that epoch for the
  next one (at a commit that saw ``pending``). The body is
  ``leaving <epoch> <worker>``, signed; a wrong signature gets 403 and
  changes nothing.

The key reaches each worker inside its ssh session (standard input, never
a command line). Nothing the service sends is secret; the signatures keep
another process from passing off epochs or announcements as bpslaunch's or
a worker's.

Example::

    service = RendezvousService(folder, key, "10.0.0.5")
    service.start()
    service.address          # "10.0.0.5:41877", given to remote workers as BYTEPS_ELASTIC_RENDEZVOUS
    service.close()
"""

from __future__ import annotations

import hmac
import http.server
import logging
import re
import threading
from typing import Optional

from byteps.common.elastic.membership import (
    SIGNATURE_HEADER,
    announce_leaving,
    leaving_message,
    public_epoch,
    read_epoch,
    signature,
)

__all__ = ["RendezvousService"]

log = logging.getLogger("byteps.launcher.rendezvous")

_LEAVING = re.compile(r"/leaving/(\d+)/(w\d+)")
_MAX_BODY = 4096


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def _answer(self, status: int, body: bytes = b"", signed: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", "application/json" if signed else "text/plain")
        if signed:
            self.send_header(SIGNATURE_HEADER, signature(self.server.key, body))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path != "/epoch":
            self._answer(404, b"unknown path: ask /epoch")
            return
        epoch = read_epoch(self.server.folder)
        if epoch is None:
            self._answer(404, b"no membership epoch yet")
            return
        self._answer(200, public_epoch(epoch), signed=True)

    def do_POST(self) -> None:  # noqa: N802
        match = _LEAVING.fullmatch(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        if match is None or not 0 <= length <= _MAX_BODY:
            self._answer(400, b"expected POST /leaving/<epoch>/<worker>")
            return
        body = self.rfile.read(length)
        number, worker = int(match.group(1)), match.group(2)
        expected = signature(self.server.key, leaving_message(worker, number))
        if body != leaving_message(worker, number) or not hmac.compare_digest(
                self.headers.get(SIGNATURE_HEADER, ""), expected):
            log.warning("rendezvous: refused an announcement for %s from %s: wrong signature (another job's "
                        "worker, or not a byteps worker)", worker, self.client_address[0])
            self._answer(403, b"wrong signature: this is another elastic job's rendezvous")
            return
        announce_leaving(self.server.folder, worker, number)
        self._answer(204)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's name)
        log.debug("rendezvous %s: " + format, self.client_address[0], *args)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: str, folder: str, key: str) -> None:
        self.folder, self.key = folder, key
        super().__init__((address, 0), _Handler)


class RendezvousService:
    """The epoch folder ``folder`` served on ``host`` (a free port), signed with ``key``."""

    def __init__(self, folder: str, key: str, host: str) -> None:
        self._server = _Server(host, folder, key)
        self._thread: Optional[threading.Thread] = None

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="bpslaunch-rendezvous",
                                        kwargs={"poll_interval": 0.2}, daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()
