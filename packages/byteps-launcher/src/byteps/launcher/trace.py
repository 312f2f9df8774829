"""Merging a job's timeline: every process's comm.json into one file a trace viewer opens.

::

    python -m byteps.launcher.trace merge ./trace            # writes ./trace/merged.json
    python -m byteps.launcher.trace merge ./trace -o job.json --png job.png

Each worker and server of a job run with BYTEPS_TRACE_ON=1 writes its own
comm.json under BYTEPS_TRACE_DIR (see :mod:`byteps.common.tracing`). The
merged file holds all their events, one process per worker (pid = rank)
and server (pid = 1000 + rank), and flow arrows that follow each
partition: from a worker's push to the server's receipt of it, and from
the server's sum to the worker's pull that brought it back. Open it in
https://ui.perfetto.dev or chrome://tracing. Every process's spans are
moved onto the scheduler's clock by the offset it estimated from its
heartbeats, unless that offset is within its own error bound (no evidence
of an offset: processes of one machine share a clock); the merged
metadata gives the shift applied to each file (``clock_shifts_s``) and the
largest error bound. ``--png`` also draws it (needs matplotlib): one row
per process and track, coloured by track, time from the first span. Every
span is drawn at least ``MIN_WIDTH_PX`` wide; spans closer together than
that are drawn as one block, labelled with how many spans it holds, so a
row of sub-millisecond spans (a server's receipts and answers) shows all
of them instead of vanishing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["merge", "draw", "blocks", "main", "MIN_WIDTH_PX"]

#: The narrowest a span is drawn, in pixels of the PNG's time axis (at its size and dpi).
MIN_WIDTH_PX = 2.0
_FIGURE_WIDTH_IN, _DPI = 12.0, 110
_AXIS_SHARE = 0.8  # about the part of the figure's width the time axis takes

# The flow ids of pushes (worker -> server) and answers (server -> worker) are kept apart by their lowest bit.
_PUSH, _ANSWER = 0, 1


def _files(directory: str) -> List[str]:
    found = []
    for folder, _, names in os.walk(directory):
        found += [os.path.join(folder, name) for name in names if name == "comm.json"]
    return sorted(found)


def _flow(kind: str, flow_id: int, span: dict, at: float, name: str) -> dict:
    return {"name": name, "cat": "flow", "ph": kind, "id": flow_id, "pid": span["pid"], "tid": span["tid"],
            "ts": at, **({"bp": "e"} if kind == "f" else {})}


def _flows(events: List[dict]) -> List[dict]:
    """Arrows per partition and step: worker push -> server receive, server sum -> worker pull."""
    spans = [e for e in events if e.get("ph") == "X"]
    receives = {(e["args"]["key"], e["args"]["step"], e["args"]["worker"]): e for e in spans if e["cat"] == "receive"}
    sums = {(e["args"]["key"], e["args"]["step"]): e for e in spans if e["cat"] == "sum"}
    flows, number = [], 0
    for push in (e for e in spans if e["cat"] == "push"):
        key, step, worker = push["args"]["key"], push["args"]["step"], push["pid"]
        receive = receives.get((key, step, worker))
        if receive is not None:
            number += 1
            flow_id = number << 1 | _PUSH
            flows += [_flow("s", flow_id, push, push["ts"], "push"),
                      _flow("f", flow_id, receive, receive["ts"], "push")]
    for pull in (e for e in spans if e["cat"] == "pull"):
        summed = sums.get((pull["args"]["key"], pull["args"]["step"]))
        if summed is not None:
            number += 1
            flow_id = number << 1 | _ANSWER
            end = summed["ts"] + summed["dur"]
            flows += [_flow("s", flow_id, summed, end, "sum"),
                      _flow("f", flow_id, pull, pull["ts"] + pull["dur"], "sum")]
    return flows


def merge(directory: str, output: Optional[str] = None) -> Tuple[str, Dict[str, int]]:
    """Merge every comm.json under ``directory`` into ``output`` (default ``directory/merged.json``).

    Returns the path and a count of processes, spans and flows; raises
    ValueError when there is nothing to merge or a file is not a trace.
    """
    files = _files(directory)
    if not files:
        raise ValueError(f"no comm.json under {directory}: was the job run with BYTEPS_TRACE_ON=1 "
                         "and BYTEPS_TRACE_DIR pointing there?")
    events: List[dict] = []
    processes, errors, unaligned, shifts = [], [], [], {}
    for path in files:
        try:
            with open(path) as handle:
                document = json.load(handle)
            metadata = document.get("metadata", {})
            offset, error = metadata.get("clock_offset_s"), metadata.get("clock_error_s")
            # An offset within its own error bound is no evidence of an offset (one machine, one clock).
            shift = 0.0 if offset is None or abs(offset) <= error else offset * 1e6
            for event in document["traceEvents"]:
                if "ts" in event:
                    event["ts"] = round(event["ts"] + shift, 1)
                events.append(event)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{path} is not a byteps trace: {exc}") from None
        processes.append(os.path.relpath(path, directory))
        shifts[processes[-1]] = shift / 1e6
        if offset is None:
            unaligned.append(processes[-1])
        else:
            errors.append(error)
    flows = _flows(events)
    output = output or os.path.join(directory, "merged.json")
    merged = {"traceEvents": events + flows, "displayTimeUnit": "ms",
              "metadata": {"sources": processes, "clock": "the scheduler's wall clock, microseconds",
                           "clock_alignment": ("offsets from heartbeat round trips" if not unaligned else
                                               f"no estimate for {unaligned}: their own clocks as recorded"),
                           "clock_shifts_s": shifts, "clock_error_bound_s": max(errors) if errors else None}}
    with open(output, "w") as out:
        json.dump(merged, out)
    counts = {"processes": len(files), "spans": sum(e.get("ph") == "X" for e in events), "flows": len(flows) // 2}
    return output, counts


def blocks(spans: List[dict], min_width_ms: float) -> List[Tuple[float, float, int]]:
    """One row's spans as drawn: ``(start ms, width ms, how many spans)`` blocks, each at least
    ``min_width_ms`` wide; a span that starts within a block's drawn extent joins it."""
    drawn: List[List[float]] = []
    for start, duration in sorted((e["ts"] / 1e3, e["dur"] / 1e3) for e in spans):
        end = start + max(duration, min_width_ms)
        if drawn and start <= drawn[-1][1]:
            drawn[-1][1] = max(drawn[-1][1], end)
            drawn[-1][2] += 1
        else:
            drawn.append([start, end, 1])
    return [(start, end - start, int(count)) for start, end, count in drawn]


def draw(events: List[dict], path: str, title: str = "") -> Dict[str, List[Tuple[float, float, int]]]:
    """A Gantt view of ``events``' spans into ``path`` (PNG): rows are process/track pairs, in pid order.

    Returns each row's blocks as drawn (:func:`blocks`, times from the first span), keyed by the row's label.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--png needs matplotlib: pip install matplotlib") from None
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        raise ValueError("nothing to draw: the trace has no spans")
    origin = min(e["ts"] for e in spans)
    extent_ms = max(max(e["ts"] + e["dur"] for e in spans) - origin, 1.0) / 1e3
    min_width_ms = extent_ms * MIN_WIDTH_PX / (_FIGURE_WIDTH_IN * _DPI * _AXIS_SHARE)
    rows = sorted({(e["pid"], e["tid"], e["cat"]) for e in spans})
    tracks = sorted({cat for _, _, cat in rows})
    colours = {cat: plt.get_cmap("tab10")(i % 10) for i, cat in enumerate(tracks)}
    figure, axes = plt.subplots(figsize=(_FIGURE_WIDTH_IN, 0.28 * len(rows) + 1.5))
    layout = {}
    for y, (pid, tid, cat) in enumerate(rows):
        label = f"{names.get(pid, pid)} · {cat}"
        row = blocks([{**e, "ts": e["ts"] - origin} for e in spans if (e["pid"], e["tid"]) == (pid, tid)],
                     min_width_ms)
        layout[label] = row
        axes.broken_barh([(start, width) for start, width, _ in row], (y - 0.4, 0.8), facecolors=colours[cat])
        for start, width, count in row:
            if count > 1:  # too dense to draw one by one: say how many
                axes.text(start + width / 2, y - 0.45, str(count), fontsize=5, ha="center", va="bottom")
    axes.set_yticks(range(len(rows)))
    axes.set_yticklabels(list(layout), fontsize=7)
    axes.invert_yaxis()
    axes.set_xlabel("ms from the first span (numbers: spans in a block too dense to draw one by one)")
    axes.set_title(title or "byteps timeline", fontsize=10)
    axes.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=_DPI)
    plt.close(figure)
    return layout


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m byteps.launcher.trace",
                                     description="Merge a job's timeline (BYTEPS_TRACE_DIR) into one trace file.")
    commands = parser.add_subparsers(dest="command", required=True)
    merging = commands.add_parser("merge", help="merge every comm.json under DIR")
    merging.add_argument("directory", metavar="DIR")
    merging.add_argument("-o", "--output", help="the merged file (default DIR/merged.json)")
    merging.add_argument("--png", help="also draw the merged trace into this PNG (needs matplotlib)")
    args = parser.parse_args(argv)
    try:
        path, counts = merge(args.directory, args.output)
        if args.png:
            with open(path) as handle:
                draw(json.load(handle)["traceEvents"], args.png, f"byteps timeline of {args.directory}")
    except ValueError as exc:
        print(f"byteps trace: {exc}", file=sys.stderr)
        return 2
    print(f"merged {counts['processes']} processes, {counts['spans']} spans, {counts['flows']} flows into {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
