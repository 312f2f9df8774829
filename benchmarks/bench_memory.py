"""Memory: a worker's and a server's peak RSS beyond what the job's gradients need, 2 workers + servers on loopback.

Each worker process imports torch, allocates a workload's float32
gradients (``--workloads``: the 100 MB tensor, ResNet-50's 161 gradients;
benchmarks/cluster/workloads.py) and runs ``--rounds`` training-like
rounds: fill every gradient, average all of them in place through
byteps.torch (``push_pull_async_inplace`` per gradient, then
``synchronize``), check the averages. The baseline is the same process
without byteps, in the same run: torch, the same gradients, the same
fills, no import of byteps and no push_pull. Reported:

* worker: peak RSS (VmHWM) of a byteps worker minus the baseline's, as a
  multiple of the gradient bytes M (goal: at most 1.0, one staging copy);
* servers: the servers' peak RSS minus their RSS once registered, before
  the first push (read by this process from /proc), summed over the
  servers, as a multiple of M, which is the bytes the servers own between
  them (goal: at most 2.0).

``BYTEPS_*`` variables in the environment reach every process, so
``BYTEPS_PARTITION_BYTES=4096000 python benchmarks/bench_memory.py`` shows
how the partition size moves the figures.

    python benchmarks/bench_memory.py [--workloads 100MB,resnet50] [--servers 1] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from loopback_job import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
MB = 1 << 20


def status_kb(pid: object, field: str) -> int:
    """A VmRSS/VmHWM line of /proc/PID/status, in KiB (pid "self": this process)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


# --- one worker (or the baseline) ------------------------------------------------------------------------
def worker_main(args: argparse.Namespace) -> None:
    sys.path.insert(0, os.path.join(HERE, "cluster"))
    import torch
    from workloads import gradient_shapes

    gradients = [(name, torch.empty(shape, dtype=torch.float32)) for name, shape in gradient_shapes(args.workload)]
    rank = int(os.environ.get("DMLC_WORKER_ID", "0"))
    if args.baseline:
        bps = None
    else:
        import byteps.torch as bps

        bps.init()
        print("READY", flush=True)
        while not os.path.exists(args.go):  # the benchmark reads the servers' idle RSS meanwhile
            time.sleep(0.01)
    rss_after = []
    for _ in range(args.rounds):
        for _, grad in gradients:
            grad.fill_(rank + 1.0)
        if bps is not None:
            handles = [bps.push_pull_async_inplace(grad, average=True, name=name) for name, grad in gradients]
            for handle in handles:
                bps.synchronize(handle)
            expected = (1.0 + args.workers) / 2  # ranks fill 1, 2, ...: their mean
            wrong = [name for name, grad in gradients if float(grad.view(-1)[0]) != expected]
            if wrong:
                raise SystemExit(f"push_pull({wrong[0]!r}) gave {float(gradients[0][1].view(-1)[0])}, "
                                 f"expected {expected}")
        rss_after.append(status_kb("self", "VmRSS"))
    peak = status_kb("self", "VmHWM")
    if bps is not None:
        bps.shutdown()
    print("MEMORY " + json.dumps({"peak_kb": peak, "rss_after_round_kb": rss_after}), flush=True)


# --- the benchmark ---------------------------------------------------------------------------------------
def worker_command(args: argparse.Namespace, workload: str, go: str, baseline: bool) -> list:
    return [sys.executable, os.path.abspath(__file__), "--as-worker", "--workload", workload, "--go", go,
            "--rounds", str(args.rounds), "--workers", str(args.workers), *(["--baseline"] if baseline else [])]


def memory_of(output: str) -> dict:
    line = next((line for line in output.splitlines() if line.startswith("MEMORY ")), None)
    if line is None:
        raise SystemExit(f"a worker printed no MEMORY line:\n{output}")
    return json.loads(line[len("MEMORY "):])


class PeakWatch(threading.Thread):
    """Reads each server's VmHWM every 20 ms while it lives (the peak is the last value read)."""

    def __init__(self, pids: list) -> None:
        super().__init__(daemon=True)
        self.peaks = {pid: 0 for pid in pids}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for pid in self.peaks:
                try:
                    self.peaks[pid] = max(self.peaks[pid], status_kb(pid, "VmHWM"))
                except (OSError, RuntimeError):
                    pass  # exited
            time.sleep(0.02)


def run_job(args: argparse.Namespace, workload: str) -> dict:
    workdir = tempfile.mkdtemp(prefix="bench_memory.")
    go = os.path.join(workdir, "go")
    env = {**os.environ, "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(free_port()),
           "DMLC_NUM_WORKER": str(args.workers), "DMLC_NUM_SERVER": str(args.servers), "DMLC_INTERFACE": "lo",
           "BYTEPS_FORCE_DISTRIBUTED": "1", "PYTHONUNBUFFERED": "1"}
    baseline = subprocess.run(worker_command(args, workload, go, True), env=env, capture_output=True, text=True,
                              timeout=600)
    if baseline.returncode != 0:
        raise SystemExit(f"the baseline failed:\n{baseline.stdout}\n{baseline.stderr}")
    server = [sys.executable, "-m", "byteps.server"]
    scheduler = subprocess.Popen(server, env={**env, "DMLC_ROLE": "scheduler"})
    servers = [subprocess.Popen(server, env={**env, "DMLC_ROLE": "server"}) for _ in range(args.servers)]
    workers = [subprocess.Popen(worker_command(args, workload, go, False),
                                env={**env, "DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(w)},
                                stdout=subprocess.PIPE, text=True) for w in range(args.workers)]
    procs = [scheduler, *servers, *workers]
    watch = PeakWatch([proc.pid for proc in servers])
    try:
        # Every worker waits for "go" after init: the servers are registered and hold nothing yet.
        for proc in workers:
            line = proc.stdout.readline()
            if line.strip() != "READY":
                raise SystemExit(f"a worker did not start: {line!r}")
        idle = {proc.pid: status_kb(proc.pid, "VmRSS") for proc in servers}
        watch.start()
        open(go, "w").close()
        outputs = [proc.communicate(timeout=600)[0] for proc in workers]
        if any(proc.returncode != 0 for proc in workers):
            raise SystemExit(f"a worker failed: exit codes {[p.returncode for p in workers]}\n" + "\n".join(outputs))
        for proc in (scheduler, *servers):
            proc.wait(timeout=30)
    finally:
        watch.done.set()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if os.path.exists(go):
            os.unlink(go)
        os.rmdir(workdir)
    sys.path.insert(0, os.path.join(HERE, "cluster"))
    from workloads import gradient_shapes, workload_bytes

    gradient_bytes = workload_bytes(workload)
    workers_memory = [memory_of(out) for out in outputs]
    base = memory_of(baseline.stdout)
    worker_extra = [(m["peak_kb"] - base["peak_kb"]) * 1024 for m in workers_memory]
    server_extra = sum((watch.peaks[pid] - idle[pid]) * 1024 for pid in idle)
    return {
        "workload": workload, "tensors": len(gradient_shapes(workload)), "gradient_bytes": gradient_bytes,
        "workers": args.workers, "servers": args.servers, "rounds": args.rounds,
        "partition_bytes": int(os.environ.get("BYTEPS_PARTITION_BYTES", 512000)),
        "baseline_peak_kb": base["peak_kb"], "worker_peak_kb": [m["peak_kb"] for m in workers_memory],
        "worker_rss_after_round_kb": [m["rss_after_round_kb"] for m in workers_memory],
        "worker_extra_x": max(worker_extra) / gradient_bytes,
        "server_idle_kb": list(idle.values()), "server_peak_kb": list(watch.peaks.values()),
        "servers_extra_x": server_extra / gradient_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="100MB,resnet50")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--as-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--go", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.as_worker:
        worker_main(args)
        return
    results = [run_job(args, workload) for workload in args.workloads.split(",")]
    print(f"{args.workers} workers + {args.servers} server(s) on loopback, {args.rounds} rounds, "
          f"BYTEPS_PARTITION_BYTES {results[0]['partition_bytes']}\n\n"
          "| workload | gradient bytes M | worker peak RSS over the baseline | servers' peak RSS over idle |\n"
          "|---|---:|---:|---:|")
    for r in results:
        worker_mb = r["worker_extra_x"] * r["gradient_bytes"] / MB
        server_mb = r["servers_extra_x"] * r["gradient_bytes"] / MB
        print(f"| {r['workload']} ({r['tensors']} tensors) | {r['gradient_bytes'] / MB:.1f} MiB | "
              f"{worker_mb:.1f} MiB = {r['worker_extra_x']:.2f} M | "
              f"{server_mb:.1f} MiB = {r['servers_extra_x']:.2f} M |")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)


if __name__ == "__main__":
    main()
