"""What each process of a job did, gathered into one summary line at its end.

``bpslaunch`` gives its children a private folder in ``BYTEPS_REPORT_DIR``;
at a clean exit every worker and server writes one small JSON file there
(:func:`write_report`), and once the job is over bpslaunch reads them all
(:func:`read_reports`) and prints :func:`summarize`'s line, e.g.::

    job done in 12.4 s: 2 workers, 150 rounds (mean 41.3 ms), each pushed 1.20 GB and pulled
    1.20 GB; servers' share of the bytes 51% / 49%

A *round* is BytePS's step: one completed push_pull of a tensor; a worker's
rounds are the most any of its tensors completed. Without the variable
(role mode, a process started by hand) nothing is written. Writing a report
never fails a job: an unwritable folder is logged and skipped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
from typing import List, Optional

__all__ = ["REPORT_DIR_VARIABLE", "ProcessReport", "write_report", "read_reports", "summarize"]

REPORT_DIR_VARIABLE = "BYTEPS_REPORT_DIR"

log = logging.getLogger("byteps.common.job_report")


@dataclasses.dataclass(frozen=True)
class ProcessReport:
    """One process's figures: for a worker what it pushed and pulled, for a server what it received and sent."""

    role: str  # "worker" or "server"
    rank: int
    wall_s: float  # from init (worker) or registration (server) to the end
    rounds: int = 0  # a worker's most completed push_pulls of one tensor
    busy_s: float = 0.0  # a worker's time from its first push_pull to its last completion
    bytes_sent: int = 0  # over the network, headers included
    bytes_received: int = 0
    async_pushes: int = 0  # a server's deltas added to asynchronous keys (BYTEPS_ENABLE_ASYNC)
    late_pushes: int = 0  # a server's pushes dropped for rounds closed without them (BYTEPS_BACKUP_WORKERS)
    shared_payloads: int = 0  # payloads sent or received through shared memory (a server on the same host)
    rdma_payloads: int = 0  # payloads sent or received by RDMA WRITE (DMLC_ENABLE_RDMA)

    @property
    def file_name(self) -> str:
        return f"{self.role}-{self.rank}.json"


def write_report(directory: Optional[str], report: ProcessReport) -> None:
    """Write ``report`` into ``directory`` (a no-op when None or empty); never raises."""
    if not directory:
        return
    path = pathlib.Path(directory) / report.file_name
    try:
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(dataclasses.asdict(report)))
        partial.replace(path)  # whole or absent: a reader never sees half a file
    except OSError as exc:
        log.warning("could not write the job report %s: %s", path, exc)


def read_reports(directory: str) -> List[ProcessReport]:
    """Every report in ``directory``, workers first, by rank; unreadable files are skipped."""
    reports = []
    for path in sorted(pathlib.Path(directory).glob("*.json")):
        try:
            reports.append(ProcessReport(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError) as exc:
            log.warning("skipped the job report %s: %s", path, exc)
    return sorted(reports, key=lambda r: (r.role != "worker", r.rank))


def _bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def summarize(reports: List[ProcessReport], wall_s: float) -> str:
    """One line: wall time, rounds and mean round time, bytes per worker, the servers' share of the bytes."""
    workers = [r for r in reports if r.role == "worker"]
    servers = [r for r in reports if r.role == "server"]
    parts = [f"job done in {wall_s:.1f} s"]
    if workers:
        rounds = max(r.rounds for r in workers)
        text = f"{len(workers)} worker{'s' if len(workers) != 1 else ''}, {rounds} round{'s' if rounds != 1 else ''}"
        busy = max(r.busy_s for r in workers)
        if rounds:
            text += f" (mean {1000 * busy / rounds:.1f} ms)"
        parts.append(text)
        pushed = sum(r.bytes_sent for r in workers) / len(workers)
        pulled = sum(r.bytes_received for r in workers) / len(workers)
        if pushed or pulled:
            parts.append(f"each pushed {_bytes(pushed)} and pulled {_bytes(pulled)}")
        elif len(workers) > 1:
            parts.append("summed in shared memory (no servers)")
    applied, late = sum(r.async_pushes for r in servers), sum(r.late_pushes for r in servers)
    if applied:
        parts.append(f"servers applied {applied} asynchronous pushes")
    if late:
        parts.append(f"{late} late pushes dropped (backup workers)")
    shared = sum(r.shared_payloads for r in workers)
    if shared:
        parts.append(f"{shared} payloads through shared memory (co-located servers)")
    written = sum(r.rdma_payloads for r in workers)
    if written:
        parts.append(f"{written} payloads by RDMA")
    total = sum(r.bytes_received for r in servers)
    if len(servers) > 1 and total:
        parts.append("servers' share of the bytes " + " / ".join(
            f"{100 * r.bytes_received / total:.0f}%" for r in servers))
    return ", ".join(parts)
