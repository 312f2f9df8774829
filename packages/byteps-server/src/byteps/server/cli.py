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
waits for. Every variable: docs/configuration.md.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from typing import List, Optional

from byteps.common.config import Config, ConfigError
from byteps.common.interface import distribution_version
from byteps.common.job_report import write_report
from byteps.common.logging_setup import configure_logging
from byteps.common.tracing import clock_metadata
from byteps.transport import Scheduler, SchedulerOptions, TransportError

__all__ = ["main"]

log = logging.getLogger("byteps.server")


def _run_scheduler(config: Config) -> None:
    host = socket.gethostbyname(config.root_uri)
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
    except TransportError as exc:
        print(f"byteps-server ({config.role}): {exc}", file=sys.stderr)
        return 1
    return 0
