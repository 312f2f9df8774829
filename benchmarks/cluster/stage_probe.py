"""Per-partition timestamps of a byteps push_pull, for "where does the time go".

Installed in a worker or server process before the job starts, it wraps the
transport's send and receive (no byteps code is changed) and records, per
partition key and round, when each PUSH and PULL_RESPONSE left or arrived.
At exit the records go to a JSON file; :func:`stages` turns the files of a
job into the pipeline's stages.
"""

from __future__ import annotations

import atexit
import json
import statistics
import time
from typing import Dict, List

from byteps.transport import Command, Endpoint

__all__ = ["install", "profile", "stages"]

_WATCHED = {int(Command.PUSH): "push", int(Command.PUSH_ACK): "push_ack", int(Command.PULL_RESPONSE): "pull_response"}


def install(path: str) -> None:
    """Record every PUSH / PULL_RESPONSE this process sends or receives; write them to ``path`` at exit."""
    records: List[list] = []
    send, recv = Endpoint.send, Endpoint.recv

    def traced_send(self, command, *args, **kwargs):
        result = send(self, command, *args, **kwargs)
        if int(command) in _WATCHED:
            key = args[1] if len(args) > 1 else kwargs.get("key", 0)
            round_ = args[2] if len(args) > 2 else kwargs.get("round", 0)
            records.append([time.time(), "sent", _WATCHED[int(command)], int(key), int(round_)])
        return result

    def traced_recv(self, *args, **kwargs):
        message = recv(self, *args, **kwargs)
        header = message.header
        if int(header.command) in _WATCHED:
            records.append([time.time(), "received", _WATCHED[int(header.command)], int(header.key),
                            int(header.round), int(header.sender)])
        return message

    Endpoint.send, Endpoint.recv = traced_send, traced_recv

    def dump() -> None:
        with open(path, "w") as out:
            json.dump(records, out)

    atexit.register(dump)


def _times(traces: List[list], direction: str, kind: str, round_: int, start: float) -> List[float]:
    """Seconds from ``start`` of every ``direction`` ("sent"/"received") record of ``kind`` in ``round_``."""
    return [r[0] - start for trace in traces for r in trace
            if r[1] == direction and r[2] == kind and r[4] == round_]


def stages(worker_traces: List[list], server_traces: List[list], round_: int, start: float) -> Dict[str, float]:
    """Seconds from ``start`` (the round's barrier release) to each stage of one round.

    first_push_complete / last_push_complete: the server received the first /
    last worker push (of any partition); first_sum / last_sum: a server sent
    the first / last answer; first_answer / last_answer: a worker received
    its first / last sum.
    """
    def times(traces, direction, kind):
        return _times(traces, direction, kind, round_, start)

    def delays(first, second):
        """Per (worker, key): ``second`` at the worker minus ``first`` at the server, for this round."""
        at_server = {}
        for trace in server_traces:
            for r in trace:
                if r[1] == "received" and r[2] == first and r[4] == round_ and len(r) > 5:
                    at_server[(r[5], r[3])] = r[0]
        return [r[0] - at_server[(w, r[3])] for w, trace in enumerate(worker_traces) for r in trace
                if r[1] == "received" and r[2] == second and r[4] == round_ and (w, r[3]) in at_server]

    pushes_in = times(server_traces, "received", "push")
    sums_out = times(server_traces, "sent", "pull_response")
    answers_in = times(worker_traces, "received", "pull_response")
    pushes_out = times(worker_traces, "sent", "push")
    return {
        "pushes_queued_by": max(pushes_out), "first_push_in": min(pushes_in), "last_push_in": max(pushes_in),
        "first_sum_out": min(sums_out), "last_sum_out": max(sums_out),
        "first_answer_in": min(answers_in), "last_answer_in": max(answers_in),
        # from a push's arrival at the server to its PUSH_ACK's at the worker: the ack's queueing on the way back
        "ack_delay_median": statistics.median(delays("push", "push_ack") or [float("nan")]),
    }


def profile(worker_traces: List[list], server_traces: List[list], round_: int, start: float,
            bin_s: float = 0.1) -> Dict[str, List[int]]:
    """Partitions arriving per ``bin_s`` from ``start``: pushes at the servers and answers at the workers.

    With partitions of one size, a flat profile is a link kept busy; dips show where the wire idled
    (the fill at the start, the drain at the end, or a stall between).
    """
    def binned(traces, direction, kind):
        times = _times(traces, direction, kind, round_, start)
        counts = [0] * (int(max(times) / bin_s) + 1 if times else 0)
        for t in times:
            counts[max(0, int(t / bin_s))] += 1
        return counts

    return {"pushes_in": binned(server_traces, "received", "push"),
            "answers_in": binned(worker_traces, "received", "pull_response")}
