"""bench_sparse's CTR step on the cluster rig: every path's workers on hosts of their own, NICs capped.

``python benchmarks/bench_sparse.py --rig`` (as root) lands here. A rig of
n + K + 1 hosts (:class:`rig.ClusterRig`, every NIC capped at ``--rate``
both ways): hosts 0..n-1 are the worker hosts, one worker process each;
hosts n..n+K-1 the server hosts (K the largest of ``--servers``); the last
host the scheduler's. Every process gets the environment of a real
multi-machine job (``DMLC_ROLE``, ``DMLC_PS_ROOT_URI``/``PORT``,
``DMLC_NUM_WORKER``, ``DMLC_NUM_SERVER``, ``DMLC_WORKER_ID``,
``DMLC_INTERFACE=eth0``), servers through ``bps_server.py``, as
``run_cluster_bench.py`` starts them (:func:`jobs.run_job`). The DDP path
runs on the same worker hosts over gloo (``GLOO_SOCKET_IFNAME=eth0``,
rank 0's host the rendezvous), no servers.

Each worker is ``bench_sparse.py --worker`` reading its own NIC's counters
(``/proc/net/dev`` in its namespace: ``eth0``'s bytes sent and received)
around the timed steps, and the wall-clock window of those steps; the
driver samples the machine's CPU (:class:`cpu_sampler.CpuSampler`) and
reports how busy it was in that window, and how full the busier direction
of the worker NICs was (bytes over the step time against the cap): near
100% the link bounds the step, far below it the 2 shared cores or the
exchanges' round trips do. The busiest server host's NIC (sent + received
over the whole job, start-up and warm-up included, per timed step: an
upper bound) says how evenly the servers share the load.
``--byteps-env NAME=VALUE`` adds a setting to every byteps process (the
rig's processes get no ``BYTEPS_``/``DMLC_`` variable of the caller's).

With ``--servers 2,4`` every byteps path runs once per server count (the
held path's throughput against its server hosts); a mode's label then
names its server hosts (``held/4s``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from cpu_sampler import CpuSampler  # noqa: E402
from jobs import Role, run_job  # noqa: E402
from rig import NIC, ClusterRig, RigError, check_privileges  # noqa: E402

__all__ = ["run"]

BYTEPS_MODES = ("row-sparse", "dense", "gather", "held")
FIRST_PORT = 9200


def roles_for(mode: str, n: int, servers: int, script: List[str], port: int, rig: ClusterRig,
              byteps_env: Dict[str, str]) -> List[Role]:
    """The processes of one job: n workers on hosts 0..n-1; for byteps, ``servers`` servers on hosts n.. and
    the scheduler on the last host, every byteps process with ``byteps_env`` added."""
    scheduler = len(rig.hosts) - 1
    if mode == "ddp-gloo":
        common = {"MASTER_ADDR": rig.address(0), "MASTER_PORT": str(port), "WORLD_SIZE": str(n),
                  "GLOO_SOCKET_IFNAME": NIC}
        return [Role(f"worker{w}", w, script, {**common, "RANK": str(w)}, True) for w in range(n)]
    common = {"DMLC_PS_ROOT_URI": rig.address(scheduler), "DMLC_PS_ROOT_PORT": str(port),
              "DMLC_NUM_WORKER": str(n), "DMLC_NUM_SERVER": str(servers), "DMLC_INTERFACE": NIC,
              "BYTEPS_ENABLE_IPC": "0", "BYTEPS_ROW_SPARSE": "0" if mode == "gather" else "1", **byteps_env}
    server_argv = [sys.executable, os.path.join(HERE, "bps_server.py")]
    roles = [Role("scheduler", scheduler, server_argv, {**common, "DMLC_ROLE": "scheduler"}, False)]
    roles += [Role(f"server{s}", n + s, server_argv, {**common, "DMLC_ROLE": "server"}, False)
              for s in range(servers)]
    roles += [Role(f"worker{w}", w, script, {**common, "DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(w)}, True)
              for w in range(n)]
    return roles


def host_counters(rig: ClusterRig, host: int) -> tuple:
    """(sent, received) bytes of a host's NIC so far."""
    stats = f"/sys/class/net/{NIC}/statistics"
    out = rig._in(rig.namespace(host), "cat", f"{stats}/tx_bytes", f"{stats}/rx_bytes").stdout.split()
    return int(out[0]), int(out[1])


def one_job(args: argparse.Namespace, rig: ClusterRig, mode: str, servers: int, port: int, workdir: str) -> dict:
    bench = os.path.join(os.path.dirname(HERE), "bench_sparse.py")
    script = [sys.executable, bench, "--worker", "--mode", mode, "--nic", NIC, "--rows", str(args.rows),
              "--dim", str(args.dim), "--batch", str(args.batch), "--steps", str(args.steps),
              "--warmup", str(args.warmup), "--lr", str(args.lr), "--skew", str(args.skew)]
    extra = dict(item.split("=", 1) for item in args.byteps_env)
    roles = roles_for(mode, args.workers, servers, script, port, rig, extra)
    server_hosts = [role.host for role in roles if role.name.startswith("server")]
    before = {host: host_counters(rig, host) for host in server_hosts}
    with open("/proc/loadavg") as load:
        loadavg = float(load.read().split()[0])
    with CpuSampler() as sampler:
        outcome = run_job(rig, roles, workdir, timeout=args.timeout, collect=False)
    if not outcome.ok:
        raise SystemExit(f"{mode} with {servers} server hosts failed: {outcome.error}")
    after = {host: host_counters(rig, host) for host in server_hosts}
    workers = []
    for w in range(args.workers):
        with open(os.path.join(workdir, f"worker{w}.log"), errors="replace") as log:
            line = next(line for line in log if line.startswith("RESULT "))
        workers.append(json.loads(line.split("RESULT ", 1)[1]))
    workers.sort(key=lambda r: r["rank"])
    # A step ends when the slowest worker's does: each step's time is the slowest worker's.
    steps = [max(r["times"][i] for r in workers) for i in range(args.steps)]
    step = statistics.median(steps)
    sent = statistics.mean(r["sent"] for r in workers) / args.steps
    received = statistics.mean(r["received"] for r in workers) / args.steps
    begin = min(r["window"][0] for r in workers)
    end = max(r["window"][1] for r in workers)
    busy = sampler.window(begin, end)["machine_busy"]
    link = max(sent, received) / step / (rig.rate_bits / 8)
    # Servers' NICs over the whole job (start-up and warm-up included), per timed step: an upper bound.
    server_bytes = [sum(after[h][i] - before[h][i] for i in (0, 1)) / args.steps for h in server_hosts]
    return {"mode": mode, "servers": servers if mode != "ddp-gloo" else 0, "step_s": step,
            "sent_per_step": sent, "received_per_step": received, "bytes_per_worker_step": sent + received,
            "link_share": link, "machine_busy": busy, "loadavg_before": loadavg,
            "server_nic_bytes_per_step": server_bytes, "logloss": workers[0]["logloss"],
            "rss_mb": workers[0]["rss_mb"], "job_s": outcome.seconds}


def run(args: argparse.Namespace, modes: List[str], server_counts: List[int]) -> Dict[str, List[dict]]:
    """Every mode (byteps modes once per server count) in turns, ``--repeats`` times; prints the table."""
    try:
        check_privileges()
    except RigError as exc:
        print(f"bench_sparse --rig: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    labels = []
    for mode in modes:
        if mode == "ddp-gloo":
            labels.append((mode, mode, 0))
        else:
            for k in server_counts:
                labels.append((mode if len(server_counts) == 1 else f"{mode}/{k}s", mode, k))
    runs: Dict[str, List[dict]] = {label: [] for label, _, _ in labels}
    port = FIRST_PORT
    hosts = args.workers + max(server_counts) + 1
    with tempfile.TemporaryDirectory() as scratch, ClusterRig(hosts, args.rate, tag="sp") as rig:
        print(f"rig: {hosts} hosts ({args.workers} workers, {max(server_counts)} server hosts, a scheduler), "
              f"NICs at {args.rate} both ways", flush=True)
        for repeat in range(args.repeats):
            for label, mode, k in labels:
                port += 1
                workdir = os.path.join(scratch, f"r{repeat}-{label.replace('/', '-')}")
                result = one_job(args, rig, mode, k, port, workdir)
                runs[label].append(result)
                print(f"repeat {repeat} {label:>13}: {result['step_s'] * 1e3:8.1f} ms/step, per worker NIC per step "
                      f"{result['sent_per_step'] / 1e6:6.2f} MB out + {result['received_per_step'] / 1e6:6.2f} MB in "
                      f"(busier direction {result['link_share']:.0%} of the cap), logloss {result['logloss']:.5f}, "
                      f"machine {result['machine_busy']:.0%} busy, load {result['loadavg_before']:.2f} before, "
                      f"job {result['job_s']:.0f} s", flush=True)
    report(args, labels, runs)
    return runs


def report(args: argparse.Namespace, labels, runs: Dict[str, List[dict]]) -> None:
    print(f"\nrig: {args.workers} worker hosts, NICs {args.rate}, {args.rows:,} rows x {args.dim}, batch {args.batch} "
          f"per worker, step = slowest worker's, median of {args.steps} steps after {args.warmup}, "
          f"median of {args.repeats} repeats:")
    base = statistics.median(run["step_s"] for run in runs[labels[0][0]])
    base_bytes = statistics.median(run["bytes_per_worker_step"] for run in runs[labels[0][0]])
    print(f"| path | server hosts | step (ms) | vs {labels[0][0]} | MB per worker NIC per step (out + in) | "
          f"bytes vs {labels[0][0]} | busier direction / cap | busiest server NIC (MB/step) | machine busy | logloss |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, mode, k in labels:
        rows = runs[label]
        step = statistics.median(r["step_s"] for r in rows)
        sent = statistics.median(r["sent_per_step"] for r in rows)
        received = statistics.median(r["received_per_step"] for r in rows)
        moved = statistics.median(r["bytes_per_worker_step"] for r in rows)
        link = statistics.median(r["link_share"] for r in rows)
        busy = statistics.median(r["machine_busy"] for r in rows)
        hottest = statistics.median(max(r["server_nic_bytes_per_step"], default=0) for r in rows)
        print(f"| {mode} | {k or '-'} | {step * 1e3:.1f} | {step / base:.2f}x | {moved / 1e6:.2f} "
              f"({sent / 1e6:.2f} + {received / 1e6:.2f}) | {moved / base_bytes:.2f}x | {link:.0%} "
              f"| {hottest / 1e6:.2f} | {busy:.0%} | {rows[-1]['logloss']:.5f} |")


def parse_servers(text: str) -> List[int]:
    counts = [int(item) for item in str(text).split(",") if item]
    if not counts or min(counts) < 1:
        raise ValueError(f"--servers {text!r}: one or more counts ≥ 1, e.g. 2 or 2,4")
    return counts

