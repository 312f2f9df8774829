"""The cluster benchmark's results as markdown tables and a matplotlib plot.

:func:`markdown` renders a results dict (what run_cluster_bench.py saves as
JSON) into the block that goes into docs/performance-notebook.md (the
``--doc`` of run_cluster_bench.py) between the ``cluster-benchmark``
markers; :func:`plot` draws time against n per system with the bounds as
lines; :func:`update_doc` puts the block in place,
appending a section the first time and touching nothing else.
"""

from __future__ import annotations

import math
import os
import re
from typing import Dict, Optional

from jobs import SYSTEMS

__all__ = ["bounds", "markdown", "plot", "update_doc"]

BEGIN, END = "<!-- cluster-benchmark:begin (generated) -->", "<!-- cluster-benchmark:end -->"
SECTION = "## Cluster benchmark: byteps against allreduce and ps-lite on capped links"
CPU_SATURATED = 0.95  # machine busy share during the timed rounds that marks a figure with †
LABELS = {"byteps": "byteps, k = n servers", "byteps-1server": "byteps, k = 1 server",
          "byteps-colocated": "byteps, servers co-located", "byteps-onebit": "byteps onebit+EF, k = n",
          "byteps-torch": "byteps.torch in place, k = n",
          "byteps-torch-outofplace": "byteps.torch out of place, k = n",
          "gloo": "gloo all_reduce (ring)",
          "mxnet": "MXNet dist_sync, k = n"}
#: One colour and marker per system, whichever systems a run has: a line's colour never depends
#: on the order in which the systems of a panel were drawn (matplotlib's default cycle would).
STYLES = {"byteps": ("tab:blue", "o"), "byteps-1server": ("tab:orange", "v"),
          "byteps-colocated": ("tab:green", "s"), "byteps-onebit": ("tab:purple", "D"),
          "byteps-torch": ("tab:cyan", "P"), "byteps-torch-outofplace": ("tab:olive", "X"),
          "gloo": ("tab:red", "^"), "mxnet": ("tab:brown", "*")}


def bounds(n: int, nbytes: int, bytes_per_s: float) -> Dict[str, float]:
    """Seconds: M/B (parameter server, k >= n), 2(n-1)/n M/B (ring), n M/B (one server)."""
    base = nbytes / bytes_per_s
    return {"ps": base, "ring": 2 * (n - 1) / n * base, "one_server": n * base}


def _cell(m: Optional[dict]) -> str:
    if m is None:
        return "–"
    if m.get("error"):
        return "failed"
    mark = " †" if m.get("machine_busy", 0) >= CPU_SATURATED else ""
    return f"**{m['median']:.2f}** ({m['min']:.2f}–{m['max']:.2f}){mark}"


def _rate_label(bits: float) -> str:
    return f"{bits / 1e9:g} Gbit/s" if bits >= 1e9 else f"{bits / 1e6:g} Mbit/s"


def markdown(results: dict) -> str:
    ns = sorted({m["n"] for m in results["measurements"]})
    rates = {int(n): c["rate_bits"] for n, c in results["calibration"].items()}
    lines = [f"Command: `{results['command']}`", "",
             f"Run {results['started']} – {results['finished']}, {results['machine']}. "
             f"Median over {results['settings']['repeats']} timed rounds for 100MB and "
             f"{results['settings']['model_repeats']} for the models (after {results['settings']['warmup']} "
             "warm-up), each round the slowest worker's, in seconds, with (min–max). "
             f"† = the machine's 2 cores were ≥ {CPU_SATURATED:.0%} busy during the timed rounds. "
             "Bounds use the cap B itself; TCP/IP headers leave ~95.6% of it for payload.", "",
             "Does the cap hold? One TCP stream on an idle link, then every NIC sending and receiving at once:", "",
             "| n | hosts | cap | idle link | all links busy (slowest) | verdict |", "|---|---:|---:|---:|---:|---|"]
    for n in ns:
        c = results["calibration"][str(n)]
        cap = c["cap_bytes_per_s"]
        tried = f" (tried {', '.join(c['tried'][:-1])} first)" if len(c.get("tried", [])) > 1 else ""
        verdict = "cap holds" if c["cap_holds"] else "CPU-bound: the cores, not the cap, limit the rig"
        lines.append(f"| {n} | {c['hosts']} | {_rate_label(c['rate_bits'])}{tried} | "
                     f"{c['idle_bytes_per_s'] / 1e6:.1f} MB/s ({c['idle_bytes_per_s'] / cap:.0%}) | "
                     f"{c['busy_min_bytes_per_s'] / 1e6:.1f} MB/s ({c['busy_min_bytes_per_s'] / cap:.0%}) | "
                     f"{verdict} |")
    header = "| system | " + " | ".join(f"n = {n} ({_rate_label(rates[n])})" for n in ns) + " |"
    for workload in results["settings"]["workloads"]:
        found = {(m["system"], m["n"]): m for m in results["measurements"] if m["workload"] == workload}
        if not found:
            continue
        nbytes = next(iter(found.values()))["bytes"]
        lines += ["", f"**{workload}** (M = {nbytes / 1e6:.1f} MB of float32 gradient per worker)", "",
                  header, "|---|" + "---:|" * len(ns)]
        for system in SYSTEMS:
            if any((system, n) in found for n in ns):
                lines.append(f"| {LABELS[system]} | " + " | ".join(_cell(found.get((system, n))) for n in ns) + " |")
        for key, label in (("ps", "bound M/B (parameter server, k ≥ n)"),
                           ("ring", "bound 2(n-1)/n·M/B (ring allreduce; co-located servers)"),
                           ("one_server", "bound n·M/B (one server)")):
            lines.append(f"| {label} | " + " | ".join(
                f"{bounds(n, nbytes, rates[n] / 8)[key]:.2f}" for n in ns) + " |")
        ps = found.get(("byteps", 4))
        if ps and not ps.get("error"):
            share = bounds(4, nbytes, rates[4] / 8)["ps"] / ps["median"]
            lines.append(f"\nbyteps (k = n) at n = 4 reaches {share:.0%} of the bound M/B.")
    if results.get("stages"):
        st = results["stages"]
        servers = "servers on the worker hosts" if st.get("system") == "byteps-colocated" else f"k = {st['n']}"
        lines += ["", f"Where the time goes: byteps, n = {st['n']}, {servers}, 100MB, "
                  f"{st['partition_bytes']}-byte partitions, seconds from the round's start "
                  "(median over the traced rounds):", "",
                  "| stage | s |", "|---|---:|"]
        for key, label in (("pushes_queued_by", "every PUSH handed to ZeroMQ"),
                           ("first_push_in", "first push received by a server"),
                           ("first_sum_out", "first partition summed, answer sent"),
                           ("first_answer_in", "first sum received by a worker"),
                           ("last_push_in", "last push received by a server"),
                           ("last_sum_out", "last partition summed, answer sent"),
                           ("last_answer_in", "last sum received by a worker = round time"),
                           ("ack_delay_median", "a PUSH_ACK's way back (median, from the push's arrival)")):
            if key in st["median"]:
                lines.append(f"| {label} | {st['median'][key]:.3f} |")
    if results.get("e2e"):
        lines += ["", "End to end: examples/torch/synthetic_benchmark.py (resnet20, batch 16 per worker, "
                  "1 torch thread per worker) trained on the rig, total img/sec (mean ± 1.96 std):", "",
                  "| n | byteps (k = n servers) | DDP over gloo | byteps / DDP |", "|---|---:|---:|---:|"]
        for n in sorted({e["n"] for e in results["e2e"]}):
            row = {e["system"]: e for e in results["e2e"] if e["n"] == n}
            cells = [f"{row[s]['img_per_s']:.1f} ± {row[s]['conf']:.1f}" if s in row and not row[s].get("error")
                     else "failed" for s in ("byteps", "gloo")]
            ratio = (f"{row['byteps']['img_per_s'] / row['gloo']['img_per_s']:.2f}"
                     if all(s in row and not row[s].get("error") for s in ("byteps", "gloo")) else "–")
            lines.append(f"| {n} | {cells[0]} | {cells[1]} | {ratio} |")
    failed = [m for m in results["measurements"] + results.get("e2e", []) if m.get("error")]
    if failed:
        lines += ["", "Failed runs:", ""] + [f"- {m['system']} n = {m['n']} {m.get('workload', 'e2e')}: "
                                             f"{m['error'][:300]}" for m in failed]
    return "\n".join(lines)


def plot(results: dict, path: str) -> None:
    """Time / (M/B) against n, one panel per workload; bounds as lines; saved as ``path``."""
    import matplotlib.pyplot as plt

    fig = figure(results)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(results: dict):
    """The matplotlib figure of :func:`plot`."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = [w for w in results["settings"]["workloads"]
                 if any(m["workload"] == w for m in results["measurements"])]
    rates = {int(n): c["rate_bits"] for n, c in results["calibration"].items()}
    cols = min(2, len(workloads))
    rows = math.ceil(len(workloads) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4.2 * rows), squeeze=False)
    for ax, workload in zip(axes.flat, workloads):
        ms = [m for m in results["measurements"] if m["workload"] == workload and not m.get("error")]
        ns = sorted({m["n"] for m in ms})
        nbytes = ms[0]["bytes"]
        for system in SYSTEMS:
            pts = sorted((m["n"], m) for m in ms if m["system"] == system)
            if not pts:
                continue
            unit = [bounds(n, nbytes, rates[n] / 8)["ps"] for n, _ in pts]
            y = [m["median"] / u for (_, m), u in zip(pts, unit)]
            err = [[(m["median"] - m["min"]) / u for (_, m), u in zip(pts, unit)],
                   [(m["max"] - m["median"]) / u for (_, m), u in zip(pts, unit)]]
            color, marker = STYLES[system]
            ax.errorbar([n for n, _ in pts], y, yerr=err, color=color, marker=marker, capsize=3, label=LABELS[system])
        fine = [2 + i * (max(ns) - 2) / 60 for i in range(61)] if len(ns) > 1 else ns
        ax.plot(fine, [1.0] * len(fine), "k--", lw=1, label="bound M/B (PS, k ≥ n)")
        ax.plot(fine, [2 * (n - 1) / n for n in fine], "k:", lw=1.3, label="bound 2(n-1)/n·M/B (ring, co-located)")
        if any(m["system"] == "byteps-1server" for m in ms):
            ax.plot(fine, fine, "k-.", lw=0.8, label="bound n·M/B (one server)")
        ax.set_xticks(ns)
        ax.set_xticklabels([f"{n}\n{_rate_label(rates[n])}" for n in ns])
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.set_xlabel("worker hosts n (NIC cap)")
        ax.set_ylabel("round time in units of M/B")
        ax.set_title(f"{workload}: M = {nbytes / 1e6:.0f} MB, M/B = {nbytes / (rates[ns[0]] / 8):.2f} s "
                     f"at {_rate_label(rates[ns[0]])}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(workloads):]:
        ax.axis("off")
    # Every panel's systems in one legend (a panel may lack some), in the fixed order of SYSTEMS.
    handles = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    axes.flat[0].legend(handles.values(), handles.keys(), fontsize=7.5, loc="upper left")
    fig.suptitle("Gradient exchange time on the simulated cluster (median, min–max; lower is better)")
    fig.tight_layout()
    return fig


def update_doc(doc_path: str, block: str, image_rel: str) -> None:
    """Put ``block`` between the markers of the cluster section; append the section if it is missing."""
    with open(doc_path) as f:
        text = f.read()
    body = f"{BEGIN}\n{block}\n\n![cluster benchmark]({image_rel})\n{END}"
    if BEGIN in text and END in text:
        text = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: body, text, flags=re.S)
    else:
        intro = ("Simulated hosts (network namespaces on one machine) with every NIC capped in both "
                 "directions; see [benchmarks/cluster/README.md](../benchmarks/cluster/README.md). "
                 "The block below is rewritten by each run.")
        text = text.rstrip("\n") + f"\n\n{SECTION}\n\n{intro}\n\n{body}\n"
    with open(doc_path, "w") as f:
        f.write(text)

