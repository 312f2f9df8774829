"""The ``byteps-server`` command: the server or scheduler role of a job.

Which role runs is DMLC_ROLE's (``server`` or ``scheduler``), as with
BytePS's servers, which reused MXNet's DMLC bootstrapping. A bad or missing
variable, or any argument but ``--help``/``--version``, is reported in one
line naming the fix, with exit status 2.

Usage::

    DMLC_ROLE=server DMLC_PS_ROOT_URI=10.0.0.1 DMLC_PS_ROOT_PORT=9000 \
        DMLC_NUM_WORKER=2 DMLC_NUM_SERVER=1 byteps-server

A server or scheduler waits for late nodes as long as it takes (set
BYTEPS_RENDEZVOUS_TIMEOUT to give up), saying every few seconds what it
waits for. The scheduler waits the same way for its own address: the name
in DMLC_PS_ROOT_URI may not resolve yet when it starts (a Kubernetes
headless Service publishes it only once the scheduler's pod has an IP), so
it is looked up again until it does. Every variable: docs/configuration.md.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
from typing import List, Optional

from byteps.common.config import Config, ConfigError
from byteps.common.interface import distribution_version
from byteps.common.job_report import write_report
from byteps.common.logging_setup import configure_logging
from byteps.common.tracing import clock_metadata
from byteps.transport import Scheduler, SchedulerOptions, TransportError

__all__ = ["main"]

log = logging.getLogger("byteps.server")

#: How often the scheduler looks its name up again, and says that it still waits for it.
_RESOLVE_RETRY_S = 0.5
_RESOLVE_NOTE_S = 5.0


class NameNotResolved(RuntimeError):
    """DMLC_PS_ROOT_URI did not resolve before BYTEPS_RENDEZVOUS_TIMEOUT."""


def resolve_root_uri(config: Config) -> str:
    """The scheduler's address: DMLC_PS_ROOT_URI looked up until it resolves, or until the rendezvous deadline
    (BYTEPS_RENDEZVOUS_TIMEOUT; none by default, as for late nodes), saying every few seconds what it waits for."""
    name, deadline = config.root_uri, config.rendezvous_timeout
    started = time.monotonic()
    noted = None
    while True:
        try:
            return socket.gethostbyname(name)
        except OSError as exc:  # socket.gaierror: not (yet) in DNS or the hosts file
            waited = time.monotonic() - started
            why = exc.strerror or str(exc)
            if deadline is not None and waited >= deadline:
                raise NameNotResolved(f"DMLC_PS_ROOT_URI={name!r} did not resolve within "
                                      f"BYTEPS_RENDEZVOUS_TIMEOUT={deadline:g} s ({why}): it must name this "
                                      "scheduler's host (in Kubernetes, its headless Service)") from None
            if noted is None or time.monotonic() - noted >= _RESOLVE_NOTE_S:
                noted = time.monotonic()
                log.warning("waiting for DMLC_PS_ROOT_URI=%r to resolve to this host's address (%s), %.0f s so far; "
                            "a Kubernetes headless Service publishes it once the scheduler's pod has an IP",
                            name, why, waited)
            time.sleep(_RESOLVE_RETRY_S)


def _run_scheduler(config: Config) -> None:
    host = resolve_root_uri(config)
    watch = config.heartbeat_timeout_s if config.heartbeat_interval_s > 0 else 0.0
    options = SchedulerOptions(host=host, port=config.root_port, num_worker_machines=config.num_worker,
                               num_servers=config.num_server, heartbeat_timeout_s=watch, secret=config.secret,
                               job_id=config.job_id or "",
                               # bpslaunch's elastic mode: which process to leave out of the next epoch
                               lost_node_file=os.environ.get("BYTEPS_LOST_NODE_FILE") or None,
                               shutdown_leaves=config.shutdown_leaves_job)
    Scheduler(options).run()


def _run_server(config: Config) -> None:
    from byteps.server.parameter_server import ParameterServer

    server = ParameterServer(config)
    try:
        server.run()
        write_report(config.report_dir, server.report())
    finally:
        if server.tracer is not None:
            server.tracer.write({"server": server.rank, **clock_metadata(server.scheduler.clock)})
        server.close()


def main(argv: Optional[List[str]] = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv and argv[0] == "--version":
        print(f"byteps-server {distribution_version('byteps-server')}")
        return 0
    if argv:
        print(f"byteps-server: unexpected argument {argv[0]!r}: the server is configured by DMLC_*/BYTEPS_* "
              "variables only (see byteps-server --help)", file=sys.stderr)
        return 2
    try:
        config = Config.from_env()
    except ConfigError as exc:
        print(f"byteps-server: bad configuration: {exc}", file=sys.stderr)
        return 2
    if config.role == "worker":
        print("byteps-server: DMLC_ROLE must be 'server' or 'scheduler' (it is unset or 'worker'); "
              "workers run the training script", file=sys.stderr)
        return 2
    configure_logging(config, config.role)
    # SIGTERM from a launcher ends the process through the normal exit path.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        if config.role == "scheduler":
            _run_scheduler(config)
        else:
            _run_server(config)
    except (TransportError, NameNotResolved) as exc:
        print(f"byteps-server ({config.role}): {exc}", file=sys.stderr)
        return 1
    return 0
