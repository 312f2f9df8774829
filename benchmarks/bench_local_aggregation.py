"""Local aggregation: 2 worker processes on one machine, ResNet-50's gradients, byteps push_pull vs gloo all_reduce.

Every round each of the two processes sums all 161 float32 gradient tensors
of ResNet-50 (102.2 MB, shapes from benchmarks/cluster/workloads.py, in
backward order) with the other, as an optimizer step would: one async call
per tensor for all of them, then a wait on all of them. Systems, each a
fresh job of 2 worker processes on 127.0.0.1:

* ``byteps``: ``bpslaunch -np 2``, a scheduler and no server: the two
  processes sum through shared memory (local aggregation);
* ``byteps-server``: ``bpslaunch -np 2 --force-distributed``: local
  aggregation, then the local sum goes to one server and back, as it would
  with other worker machines in the job;
* ``byteps-nola``: ``bpslaunch --workers 2 --servers 1``: two one-process
  "machines", so each process pushes its whole gradient to the server and
  pulls the sum back: byteps without local aggregation;
* ``gloo``: torch.distributed gloo ``all_reduce`` (ring) of the same tensors,
  2 ranks, ``async_op=True`` for all, then ``wait()`` on all; ranks unpinned,
  as torchrun leaves them;
* ``gloo-pinned``: the same, each rank pinned to the CPUs bpslaunch gives
  its worker of the same local rank (the launcher's own core assignment);
* ``byteps-unpinned`` (not run by default): ``byteps`` with
  ``BYTEPS_NUMA_ON=0``, so bpslaunch leaves the workers unpinned too.

bpslaunch pins each byteps worker to its own CPUs (one core each on a
2-core machine), which matters a lot here: hence both gloo rows.

Each job runs one warm-up round and ``--rounds`` timed rounds; each round
starts at a barrier, its time is the slower process's, and every round's
result is checked against the expected sum (1 + 2 = 3) outside the timing.
The systems are run ``--repeats`` times, interleaved (the order rotates
each repeat), so the machine's noise hits them alike.

Reported per system: median round time over all timed rounds (min–max),
GB/s of gradient bytes (one process's 102.2 MB / round time), and gloo's
time over the system's (> 1: faster than unpinned gloo), from the medians
and per repeat (min–max).

    python benchmarks/bench_local_aggregation.py [--rounds 5] [--repeats 3] [--systems ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from math import prod
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

HERE = Path(__file__).resolve().parent
#: name -> (how it starts: bpslaunch arguments, or "gloo"; extra environment; what the table calls it)
SYSTEMS = {
    "byteps": (["-np", "2"], {}, "byteps push_pull, local aggregation, no server (`-np 2`)"),
    "byteps-server": (["-np", "2", "--force-distributed"], {},
                      "byteps push_pull, local aggregation + 1 server (`-np 2 --force-distributed`)"),
    "byteps-nola": (["--workers", "2", "--servers", "1"], {},
                    "byteps push_pull, no local aggregation, 1 server (`--workers 2 --servers 1`)"),
    "byteps-unpinned": (["-np", "2"], {"BYTEPS_NUMA_ON": "0"},
                        "byteps push_pull, local aggregation, workers unpinned (`BYTEPS_NUMA_ON=0 ... -np 2`)"),
    "gloo": ("gloo", {}, "torch.distributed gloo all_reduce (ring), 2 ranks, unpinned"),
    "gloo-pinned": ("gloo", {}, "gloo all_reduce, ranks pinned to the CPUs bpslaunch gives its workers"),
}
DEFAULT_SYSTEMS = ("byteps", "byteps-server", "byteps-nola", "gloo", "gloo-pinned")
JOB_TIMEOUT_S = 180


def load_workloads():
    spec = importlib.util.spec_from_file_location("bench_workloads", HERE / "cluster" / "workloads.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# --- the worker processes ------------------------------------------------------------------


def write_result(args: argparse.Namespace, rank: int, record: dict) -> None:
    record.update(rank=rank, cpus=sorted(os.sched_getaffinity(0)))
    path = Path(args.out) / f"rank{rank}.json"
    path.write_text(json.dumps(record))


def byteps_worker(args: argparse.Namespace) -> None:
    """One byteps worker (started by bpslaunch): push_pull every gradient per round, time each round."""
    import byteps.common as bps

    shapes = load_workloads().gradient_shapes(args.workload)
    bps.init()
    rank, size = bps.rank(), bps.size()
    names = [name for name, _ in shapes]
    grads = [np.empty(shape, dtype=np.float32) for _, shape in shapes]
    for name, grad in zip(names, grads):
        bps.declare(name, nbytes=grad.nbytes, itemsize=grad.itemsize)
    expected = float(size * (size + 1) // 2)
    times, issue = [], []
    try:
        for i in range(1 + args.rounds):  # round 0 warms up (segments, connections, server buffers)
            for grad in grads:
                grad.fill(rank + 1)
            bps.barrier()
            start = time.perf_counter()
            handles = [bps.push_pull_async(grad, name=name, average=False) for grad, name in zip(grads, names)]
            issued = time.perf_counter()
            for handle in handles:
                bps.synchronize(handle)
            end = time.perf_counter()
            check(grads, expected, names, f"byteps round {i}")
            if i:
                times.append(end - start)
                issue.append(issued - start)
        write_result(args, rank, {"times": times, "issue": issue, "size": size})
    finally:
        bps.shutdown()


def gloo_worker(args: argparse.Namespace) -> None:
    """One gloo rank: all_reduce every gradient per round (async, then wait), time each round."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    shapes = load_workloads().gradient_shapes(args.workload)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.world)
    try:
        grads = [torch.empty(shape, dtype=torch.float32) for _, shape in shapes]
        names = [name for name, _ in shapes]
        expected = float(args.world * (args.world + 1) // 2)
        times, issue = [], []
        for i in range(1 + args.rounds):
            for grad in grads:
                grad.fill_(args.rank + 1)
            dist.barrier()
            start = time.perf_counter()
            works = [dist.all_reduce(grad, async_op=True) for grad in grads]
            issued = time.perf_counter()
            for work in works:
                work.wait()
            end = time.perf_counter()
            check([g.numpy() for g in grads], expected, names, f"gloo round {i}")
            if i:
                times.append(end - start)
                issue.append(issued - start)
        write_result(args, args.rank, {"times": times, "issue": issue, "size": args.world})
    finally:
        dist.destroy_process_group()


def check(grads: Sequence[np.ndarray], expected: float, names: Sequence[str], what: str) -> None:
    for grad, name in zip(grads, names):
        if not (grad == expected).all():
            raise SystemExit(f"{what}: {name} holds {grad.ravel()[:4]}..., expected {expected}")


# --- the parent: start jobs, collect, report ------------------------------------------------


def stop_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the process group ``proc`` leads (its own session), then SIGKILL after ``grace_s``."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def wait_all(procs: Sequence[subprocess.Popen], timeout_s: float) -> list:
    """Wait for every process; stop early when one fails (its peer would wait for it). Returns the failures."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        codes = [proc.poll() for proc in procs]
        failed = [code for code in codes if code not in (None, 0)]
        if failed or all(code == 0 for code in codes):
            return failed
        time.sleep(0.05)
    return [f"timeout after {timeout_s:.0f} s"]


def gloo_cpus() -> List[Optional[Tuple[int, ...]]]:
    """The CPUs bpslaunch would give 2 local workers here (None: unpinned)."""
    from byteps.common.config import Config
    from byteps.launcher.core_assignment import assign_cores
    from byteps.launcher.topology import read_topology

    stand_in = {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "1", "DMLC_NUM_SERVER": "1"}
    assignment = assign_cores(read_topology(gpus=False), Config.from_env({**os.environ, **stand_in}), workers=2)
    return [assignment.for_worker(i) for i in range(2)]


def run_job(system: str, args: argparse.Namespace, pins: List[Optional[Tuple[int, ...]]]) -> dict:
    """Start one job of ``system``, wait for it, return {"times": per-round max over ranks, ...}."""
    with tempfile.TemporaryDirectory(prefix="bench-la-") as out:
        log_path = Path(out) / "log.txt"
        worker_args = ["--workload", args.workload, "--rounds", str(args.rounds), "--out", out]
        procs: List[subprocess.Popen] = []
        with open(log_path, "w") as log:
            try:
                how, extra_env, _ = SYSTEMS[system]
                if how == "gloo":
                    port = free_port()
                    for rank in range(2):
                        cpus = pins[rank] if system == "gloo-pinned" else None
                        procs.append(subprocess.Popen(
                            [sys.executable, __file__, "--role", "gloo-worker", "--rank", str(rank), "--world", "2",
                             "--port", str(port), *worker_args],
                            env={**os.environ, "GLOO_SOCKET_IFNAME": "lo"}, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True,
                            preexec_fn=(lambda c=cpus: os.sched_setaffinity(0, c)) if cpus else None))
                else:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "byteps.launcher", *how, "--",
                         sys.executable, __file__, "--role", "byteps-worker", *worker_args],
                        env={**os.environ, **extra_env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
                failed = wait_all(procs, JOB_TIMEOUT_S)
            finally:
                for proc in procs:
                    stop_group(proc)
        if failed:
            raise RuntimeError(f"{system} job failed ({failed}); its output:\n{log_path.read_text()[-6000:]}")
        ranks = [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in range(2)]
    return {"times": [max(pair) for pair in zip(*(r["times"] for r in ranks))],
            "issue": [max(pair) for pair in zip(*(r["issue"] for r in ranks))],
            "cpus": [r["cpus"] for r in ranks]}


def summarize(runs: Dict[str, List[dict]], nbytes: int) -> Dict[str, dict]:
    gloo = runs.get("gloo")
    figures = {}
    for system, jobs in runs.items():
        times = [t for job in jobs for t in job["times"]]
        median = statistics.median(times)
        entry = {"median_s": median, "min_s": min(times), "max_s": max(times), "gbps": nbytes / median / 1e9,
                 "rounds_s": [job["times"] for job in jobs], "issue_median_s": statistics.median(
                     [t for job in jobs for t in job["issue"]]), "cpus": jobs[0]["cpus"]}
        if gloo:
            gloo_median = statistics.median([t for job in gloo for t in job["times"]])
            per_repeat = [statistics.median(g["times"]) / statistics.median(j["times"]) for g, j in zip(gloo, jobs)]
            entry.update(gloo_ratio=gloo_median / median, gloo_ratio_min=min(per_repeat),
                         gloo_ratio_max=max(per_repeat))
        figures[system] = entry
    return figures


def table(figures: Dict[str, dict]) -> str:
    lines = ["| system | round, s: median (min–max) | GB/s | gloo / system (per repeat) |",
             "|---|---:|---:|---:|"]
    for system, f in figures.items():
        ratio = (f"{f['gloo_ratio']:.2f} ({f['gloo_ratio_min']:.2f}–{f['gloo_ratio_max']:.2f})"
                 if "gloo_ratio" in f else "–")
        lines.append(f"| {SYSTEMS[system][2]} | {f['median_s']:.3f} ({f['min_s']:.3f}–{f['max_s']:.3f}) | "
                     f"{f['gbps']:.2f} | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="resnet50", help="from benchmarks/cluster/workloads.py")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per job (after 1 warm-up)")
    parser.add_argument("--repeats", type=int, default=3, help="jobs per system, interleaved")
    parser.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                        help=f"comma-separated, of: {', '.join(SYSTEMS)}")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--role", choices=("main", "byteps-worker", "gloo-worker"), default="main",
                        help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "byteps-worker":
        return byteps_worker(args)
    if args.role == "gloo-worker":
        return gloo_worker(args)

    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
    shapes = load_workloads().gradient_shapes(args.workload)
    nbytes = 4 * sum(prod(shape) for _, shape in shapes)
    pins = gloo_cpus()
    began = time.monotonic()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    runs: Dict[str, List[dict]] = {s: [] for s in systems}
    for repeat in range(args.repeats):
        order = systems[repeat % len(systems):] + systems[:repeat % len(systems)]
        for system in order:
            job = run_job(system, args, pins)
            runs[system].append(job)
            print(f"repeat {repeat + 1}/{args.repeats} {system}: " + " ".join(f"{t:.3f}" for t in job["times"]),
                  file=sys.stderr, flush=True)
    figures = summarize(runs, nbytes)
    print(f"{args.workload}: {len(shapes)} float32 tensors, {nbytes / 1e6:.1f} MB per process; 2 processes; "
          f"{args.repeats} jobs x {args.rounds} timed rounds per system, interleaved; "
          f"total {time.monotonic() - began:.0f} s\n")
    print(table(figures))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"started": started, "workload": args.workload, "tensors": len(shapes), "bytes": nbytes,
                       "rounds": args.rounds, "repeats": args.repeats, "load_average": os.getloadavg(),
                       "systems": figures}, out, indent=2)


if __name__ == "__main__":
    main()
