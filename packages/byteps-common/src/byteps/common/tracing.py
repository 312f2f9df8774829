"""The timeline: what each worker and server did, as Chrome trace events (BytePS's BYTEPS_TRACE_*).

With ``BYTEPS_TRACE_ON=1`` every worker and server process records, for
the rounds ``BYTEPS_TRACE_START_STEP``..``BYTEPS_TRACE_END_STEP`` of every
tensor (a tensor's step is its count of push_pulls, the first being step
1, as in BytePS), one span per tensor and step and one per partition and
stage of its route (copy in, local reduce, compress, push, pull,
decompress, local broadcast, copy out); a server records, per partition
and worker, the receipt of each push, each round's sum (from its first
push to the last) and each answer to a pull. A process writes its file
when it leaves the job (docs/timeline.md)::

    <BYTEPS_TRACE_DIR>/<local rank>/comm.json             one worker machine (BytePS's layout)
    <BYTEPS_TRACE_DIR>/machine<id>/<local rank>/comm.json several machines sharing one directory
    <BYTEPS_TRACE_DIR>/server<id>/comm.json                servers

Files are Chrome's trace event format (chrome://tracing, Perfetto):
``{"traceEvents": [...], "metadata": {...}}`` with complete events
(``"ph": "X"``, microseconds of wall-clock time), one process per file
(pid: the worker's rank, 1000 + a server's rank) and one thread per kind
of span; the metadata holds the process's clock offset from the
scheduler's, estimated from heartbeat round trips, and its error bound.
``python -m byteps.launcher.trace merge DIR`` joins them on the
scheduler's clock.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any, Dict, List, Optional

__all__ = ["Tracer", "clock_metadata", "worker_trace_path", "server_trace_path", "WORKER_TRACKS", "SERVER_TRACKS",
           "SERVER_PID_BASE"]

#: One trace thread per kind of span, in route order (tid = position + 1).
WORKER_TRACKS = ("tensor", "copy_in", "local_reduce", "compress", "push", "pull", "decompress", "local_broadcast",
                 "copy_out", "sparse_exchange", "sparse_merge", "sparse_to_root", "sparse_local_sum",
                 "sparse_local_answer")
SERVER_TRACKS = ("receive", "sum", "answer")
SERVER_PID_BASE = 1000


def worker_trace_path(directory: str, machine: int, machines: int, local_rank: int) -> str:
    if machines == 1:
        return os.path.join(directory, str(local_rank), "comm.json")
    return os.path.join(directory, f"machine{machine}", str(local_rank), "comm.json")


def server_trace_path(directory: str, rank: int) -> str:
    return os.path.join(directory, f"server{rank}", "comm.json")


class Tracer:
    """One process's spans of the traced steps; :meth:`write` saves them.

    Creating it makes the file's folder and proves it writable, so a bad
    BYTEPS_TRACE_DIR fails at init, naming the variable.
    """

    def __init__(self, path: str, process: str, pid: int, tracks: tuple, start_step: int, end_step: int) -> None:
        self.path, self.pid, self.tracks = path, pid, tracks
        self.first_round, self.last_round = start_step - 1, end_step - 1  # rounds count from 0, steps from 1
        folder = os.path.dirname(path) or "."
        try:
            os.makedirs(folder, exist_ok=True)
            probe = os.path.join(folder, f".probe-{os.getpid()}")
            with open(probe, "w"):
                pass
            os.remove(probe)
        except OSError as exc:
            raise ValueError(f"BYTEPS_TRACE_DIR: cannot write the trace {path}: {exc}") from None
        self._lock = threading.Lock()
        self._events: List[Dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": process}},
            {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}},
            *({"name": "thread_name", "ph": "M", "pid": pid, "tid": i + 1, "args": {"name": track}}
              for i, track in enumerate(tracks)),
        ]
        self._written = False

    def traces(self, round_: int) -> bool:
        """Whether round ``round_`` (0-based) of a tensor is in the traced steps."""
        return self.first_round <= round_ <= self.last_round

    def span(self, track: str, name: str, start_s: float, end_s: float, **args: Any) -> None:
        """A complete event on ``track`` from ``start_s`` to ``end_s`` (time.time() seconds)."""
        event = {"name": name, "cat": track, "ph": "X", "pid": self.pid, "tid": self.tracks.index(track) + 1,
                 "ts": round(start_s * 1e6, 1), "dur": round(max(0.0, end_s - start_s) * 1e6, 1), "args": args}
        with self._lock:
            self._events.append(event)

    def write(self, metadata: Optional[Dict[str, Any]] = None) -> str:
        """Save every span so far (again, if called twice); returns the path."""
        with self._lock:
            document = {"traceEvents": list(self._events), "displayTimeUnit": "ms",
                        "metadata": {"clock": "wall clock (time.time), microseconds", **(metadata or {})}}
        partial = f"{self.path}.{os.getpid()}.tmp"
        with open(partial, "w") as out:
            json.dump(document, out)
        os.replace(partial, self.path)
        self._written = True
        return self.path


def clock_metadata(clock: Any) -> Dict[str, Any]:
    """A trace's clock fields from a :class:`byteps.transport.ClockEstimate` (None: not estimated)."""
    if clock is None or clock.offset_s is None:
        return {"clock_offset_s": None, "clock_error_s": None}
    return {"clock_offset_s": clock.offset_s, "clock_error_s": clock.error_s}
