"""The cluster benchmark: byteps against ring allreduce and ps-lite on simulated hosts with capped NICs.

Needs root (network namespaces, veth, tc). For each n it builds a rig of
2n+1 hosts (n worker hosts, n CPU server hosts, one scheduler host), checks
that the cap holds with every NIC busy (halving the rate while the cores
cannot keep up), then times one gradient exchange of each workload with
each system, writes the table into docs/performance-notebook.md (the dated
record; docs/performance.md quotes its headline figures) and the plot into
docs/img/. ``--smoke`` is the quick check the test suite runs: 2 hosts, a
tiny tensor, a few seconds.

    sudo python benchmarks/cluster/run_cluster_bench.py                  # everything (about an hour)
    sudo python benchmarks/cluster/run_cluster_bench.py --workers 4 --workloads 100MB --no-e2e
    sudo python benchmarks/cluster/run_cluster_bench.py --smoke
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

from calibration import all_to_all, calibrate, probe
from jobs import DEFAULT_SYSTEMS, SYSTEMS, hosts_needed, layout, run_job
from rig import ClusterRig, RigError, check_privileges, parse_rate_bits
from workloads import WORKLOADS, workload_bytes

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MXNET_REQUIREMENTS = ["mxnet==1.9.1", "numpy==1.23.5"]  # one pip call: anything later may upgrade numpy
MIN_RATE_BITS = 50e6


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--workers", default="2,4,8", help="worker host counts n (default 2,4,8)")
    p.add_argument("--rate", default="500mbit", help="NIC cap, both directions (tc units; default 500mbit)")
    p.add_argument("--fixed-rate", action="store_true",
                   help="keep --rate even where the calibration finds the cores, not the cap, limiting")
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   help=f"subset of {','.join(WORKLOADS)}; empty: only the end-to-end runs")
    p.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS), help=f"subset of {','.join(SYSTEMS)}")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5, help="timed rounds of the 100MB tensor")
    p.add_argument("--model-repeats", type=int, default=3, help="timed rounds of each model's gradients")
    p.add_argument("--mxnet-venv", default=os.path.join(ROOT, ".nox", "_cluster_mxnet"),
                   help="venv with mxnet 1.9.1 (created with mxnet==1.9.1 numpy==1.23.5 if missing)")
    p.add_argument("--trace-n", type=int, default=4, help="n of the traced byteps run (per-stage timings); 0: none")
    p.add_argument("--all-to-all", action="store_true",
                   help="after calibrating, stream from every worker host to every other at once and report "
                        "each NIC's rate (the co-located pattern, raw TCP)")
    p.add_argument("--trace-system", default="byteps", choices=["byteps", "byteps-colocated"],
                   help="servers of the traced run: dedicated (byteps) or on the worker hosts")
    p.add_argument("--no-e2e", action="store_true", help="skip the end-to-end training comparison")
    p.add_argument("--e2e-workers", default="2,4")
    p.add_argument("--e2e-iters", type=int, default=10, help="timed iterations of the synthetic benchmark")
    p.add_argument("--e2e-model", default="resnet20",
                   help="the synthetic benchmark's model (resnet20; mlp: communication-bound)")
    p.add_argument("--e2e-systems", default="byteps,gloo", help="subset of byteps,byteps-onebit,gloo")
    p.add_argument("--results", default=os.path.join(ROOT, "docs", "img", "cluster_benchmark.json"))
    p.add_argument("--plot", default=os.path.join(ROOT, "docs", "img", "cluster_benchmark.png"))
    p.add_argument("--doc", default=os.path.join(ROOT, "docs", "performance-notebook.md"),
                   help="the page whose cluster-benchmark block is rewritten")
    p.add_argument("--no-doc", action="store_true", help="write the results JSON only")
    p.add_argument("--render-only", action="store_true", help="redraw table and plot from --results; no rig")
    p.add_argument("--workdir", help="logs and per-process results (default: a temporary folder)")
    p.add_argument("--byteps-env", action="append", default=[], metavar="NAME=VALUE",
                   help="extra environment for byteps processes, e.g. BYTEPS_SCHEDULING_CREDIT=8 (repeatable)")
    p.add_argument("--backward-ms", type=float, default=0.0,
                   help="byteps workers submit a model's gradients over this long, in backward order (bps_worker.py)")
    p.add_argument("--op", choices=("allreduce", "allgather", "reducescatter"), default="allreduce",
                   help="the collective the workers time (allgather/reducescatter: 100MB only, byteps systems "
                        "through byteps.torch, gloo through torch.distributed; no mxnet)")
    p.add_argument("--smoke", action="store_true", help="2 hosts, tiny tensor: the test suite's quick check")
    return p.parse_args(argv)


def ensure_mxnet(venv: str) -> str:
    """Python of a venv that imports mxnet 1.9.1; creates it on first use."""
    python = os.path.join(venv, "bin", "python")
    check = [python, "-c", "import mxnet, numpy; assert mxnet.__version__ == '1.9.1', mxnet.__version__"]
    if os.path.exists(python) and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    print(f"creating the MXNet venv {venv} ({' '.join(MXNET_REQUIREMENTS)})", flush=True)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", *MXNET_REQUIREMENTS], check=True)
    subprocess.run(check, check=True)
    return python


class Bench:
    """One run: the rigs, the measurements, the results file kept up to date."""

    def __init__(self, args: argparse.Namespace, workdir: str) -> None:
        self.args, self.workdir = args, workdir
        self.port = 9100
        self.results: Dict = {
            "command": "python benchmarks/cluster/run_cluster_bench.py" + "".join(
                f" {shlex.quote(a)}" for a in sys.argv[1:]),
            "started": _now(), "finished": None,
            "machine": f"{os.cpu_count()} cores, {platform.system()} {platform.release()}, Python "
                       f"{platform.python_version()}",
            "settings": {"workloads": _listed(args.workloads), "systems": _listed(args.systems),
                         "warmup": args.warmup, "repeats": args.repeats, "model_repeats": args.model_repeats,
                         "rate": args.rate, "op": args.op},
            "calibration": {}, "measurements": [], "stages": None, "e2e": []}
        self.mxnet_python: Optional[str] = None

    def save(self) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(self.args.results)), exist_ok=True)
        with open(self.args.results, "w") as f:
            json.dump(self.results, f, indent=1)

    def next_port(self) -> int:
        self.port += 1
        return self.port

    def run(self) -> None:
        args = self.args
        if "mxnet" in self.results["settings"]["systems"]:
            try:
                self.mxnet_python = ensure_mxnet(args.mxnet_venv)
            except (subprocess.CalledProcessError, OSError) as exc:
                print(f"MXNet baseline skipped: its venv could not be made ({exc})", file=sys.stderr)
                self.results["settings"]["systems"].remove("mxnet")
        for n in [int(x) for x in args.workers.split(",")]:
            with ClusterRig(hosts_needed(n), args.rate, tag=f"n{n}") as rig:
                self.calibrate(rig, n)
                if args.all_to_all:
                    self.all_to_all(rig, n)
                for workload in self.results["settings"]["workloads"]:
                    for system in self.results["settings"]["systems"]:
                        self.measure(rig, n, workload, system)
                if n == args.trace_n and args.trace_system in self.results["settings"]["systems"]:
                    self.trace(rig, n)
                if not args.no_e2e and str(n) in args.e2e_workers.split(","):
                    for system in args.e2e_systems.split(","):
                        self.e2e(rig, n, system)
        self.results["finished"] = _now()
        self.save()

    def calibrate(self, rig: ClusterRig, n: int) -> None:
        tried = []
        while True:
            tried.append(rig.rate)
            report = calibrate(rig, os.path.join(self.workdir, f"n{n}", f"calibrate-{rig.rate}"))
            report.update(rate_bits=rig.rate_bits, tried=tried)
            print(f"n={n} at {rig.rate}: idle link {report['idle_bytes_per_s'] / 1e6:.1f} MB/s, all "
                  f"{report['hosts']} busy >= {report['busy_min_bytes_per_s'] / 1e6:.1f} MB/s "
                  f"(cap {report['cap_bytes_per_s'] / 1e6:.1f})", flush=True)
            if report["cap_holds"] or self.args.fixed_rate or rig.rate_bits / 2 < MIN_RATE_BITS:
                break
            rig.set_rate(f"{int(rig.rate_bits / 2 / 1e6)}mbit")
            print(f"  the cores, not the cap, limit {report['hosts']} busy hosts: lowering the cap to {rig.rate}")
        self.results["calibration"][str(n)] = report
        self.save()

    def all_to_all(self, rig: ClusterRig, n: int) -> None:
        report = all_to_all(rig, n, os.path.join(self.workdir, f"n{n}", "all-to-all"))
        self.results.setdefault("all_to_all", {})[str(n)] = report
        per_host = report["per_host_bytes_per_s"]
        streams = report["per_stream_bytes_per_s"]
        print(f"n={n} all-to-all, raw TCP: each NIC out {min(per_host) / 1e6:.1f}-{max(per_host) / 1e6:.1f} MB/s "
              f"(streams {min(streams) / 1e6:.1f}-{max(streams) / 1e6:.1f} MB/s)", flush=True)
        self.save()

    def byteps_env(self, system: str) -> Dict[str, str]:
        """--byteps-env settings, for byteps systems only."""
        if not system.startswith("byteps"):
            return {}
        pairs = [item.split("=", 1) for item in self.args.byteps_env]
        for pair in pairs:
            if len(pair) != 2 or not pair[0].startswith(("BYTEPS_", "PS_")):
                raise SystemExit(f"--byteps-env expects BYTEPS_NAME=VALUE, got {'='.join(pair)!r}")
        return dict(pairs)

    def measure(self, rig: ClusterRig, n: int, workload: str, system: str) -> None:
        repeats = self.args.repeats if workload == "100MB" else self.args.model_repeats
        nbytes = workload_bytes(workload)
        unit = nbytes / (rig.rate_bits / 8) * (n if system == "byteps-1server" else 2)
        workdir = os.path.join(self.workdir, f"n{n}", workload, system)
        extra = ["--backward-ms", str(self.args.backward_ms)] if self.args.backward_ms and system.startswith(
            "byteps") else []
        if self.args.op != "allreduce":
            if system == "mxnet":
                raise SystemExit(f"--op {self.args.op}: not measured for mxnet (KVStore has no such collective)")
            extra += ["--op", self.args.op]
        roles = layout(system, n, ["--workload", workload, "--warmup", str(self.args.warmup), "--repeats",
                                   str(repeats), *extra], workdir, self.next_port(), len(rig.hosts) - 1, rig.address,
                       mxnet_python=self.mxnet_python, extra_env=self.byteps_env(system))
        before = rig.link_counters()
        outcome = run_job(rig, roles, workdir, timeout=120 + (self.args.warmup + repeats) * unit * 4)
        after = rig.link_counters()
        # What the whole job (warm-up and timed rounds) did to the NICs' queues: drops cost TCP retransmissions.
        links = {name: after[name] - before[name] for name in after}
        record = {"n": n, "rate": rig.rate, "rate_bits": rig.rate_bits, "workload": workload, "bytes": nbytes,
                  "system": system, "op": self.args.op, "seconds_total": outcome.seconds, "links": links}
        if outcome.ok:
            rounds = [max(r["times"][i] for r in outcome.results) for i in range(repeats)]
            record.update(times=rounds, **_summary(rounds), **outcome.cpu)
            if all("first_layer" in r for r in outcome.results) and len(outcome.results[0]["times"]) > 0:
                # When the last worker had its first layer's sum back (byteps; server-side scheduling's figure)
                firsts = [max(r["first_layer"][i] for r in outcome.results) for i in range(repeats)]
                record["first_layer_median"] = statistics.median(firsts)
            first = f", first layer back {record['first_layer_median']:.3f} s" if "first_layer_median" in record else ""
            print(f"n={n} {workload:9} {system:17} {record['median']:7.3f} s ({record['min']:.3f}-"
                  f"{record['max']:.3f}) machine busy {outcome.cpu.get('machine_busy', 0):.0%}{first}; "
                  f"packets dropped up {links['up_dropped']} down {links['down_dropped']} of "
                  f"{links['up_bytes'] / 1e6:.0f} MB sent", flush=True)
        else:
            record["error"] = outcome.error
            print(f"n={n} {workload:9} {system:17} FAILED: {outcome.error[:500]}", flush=True)
        self.results["measurements"].append(record)
        self.save()

    def trace(self, rig: ClusterRig, n: int) -> None:
        """byteps (--trace-system) on 100MB with every PUSH and answer timestamped: where the time goes."""
        import stage_probe

        system = self.args.trace_system
        workdir = os.path.join(self.workdir, f"n{n}", "trace")
        rounds = 4
        roles = layout(system, n, ["--workload", "100MB", "--warmup", "1", "--repeats", str(rounds)], workdir,
                       self.next_port(), len(rig.hosts) - 1, rig.address, trace=True,
                       extra_env=self.byteps_env(system))
        outcome = run_job(rig, roles, workdir, timeout=300)
        if not outcome.ok:
            print(f"traced run failed: {outcome.error[:500]}", flush=True)
            return
        traces = {}
        for kind, count in (("worker", n), ("server", n)):
            traces[kind] = []
            for i in range(count):
                with open(os.path.join(workdir, f"trace-{kind}{i}.json")) as f:
                    traces[kind].append(json.load(f))
        per_round, profiles = [], []
        for i in range(rounds):
            start = min(r["starts"][i] for r in outcome.results)
            per_round.append(stage_probe.stages(traces["worker"], traces["server"], 1 + i, start))
            profiles.append(stage_probe.profile(traces["worker"], traces["server"], 1 + i, start))
        median = {k: statistics.median(r[k] for r in per_round) for k in per_round[0]}
        from byteps.common.config import Config

        self.results["stages"] = {"n": n, "system": system, "partition_bytes": Config.from_env({}).partition_bytes,
                                  "rounds": per_round, "median": median, "profiles": profiles}
        print(f"stages of {system} (median s): " + ", ".join(f"{k} {v:.3f}" for k, v in median.items()), flush=True)
        for i, counts in enumerate(profiles):
            print(f"  round {i + 1}, partitions per 0.1 s: pushes in {counts['pushes_in']}; "
                  f"answers in {counts['answers_in']}", flush=True)
        self.save()

    def e2e(self, rig: ClusterRig, n: int, system: str) -> None:
        """The synthetic benchmark trained on the rig: byteps (k = n servers, byteps-onebit compressed) or native
        DDP over gloo."""
        workdir = os.path.join(self.workdir, f"n{n}", f"e2e-{system}")
        script = os.path.join(HERE, "ddp_synthetic.py") if system == "gloo" \
            else os.path.join(ROOT, "examples", "torch", "synthetic_benchmark.py")
        model = self.args.e2e_model
        roles = layout(system, n, ["--num-threads", "1", "--num-iters", str(self.args.e2e_iters), "--model", model],
                       workdir, self.next_port(), len(rig.hosts) - 1, rig.address, worker_script=script,
                       extra_env=self.byteps_env(system))
        outcome = run_job(rig, roles, workdir, timeout=900, collect=False)
        record = {"n": n, "system": system, "rate": rig.rate, "model": model}
        with open(os.path.join(workdir, "worker0.log"), errors="replace") as f:
            found = re.search(r"Total img/sec on \d+ worker\(s\): ([0-9.]+) \+-([0-9.]+)", f.read())
        if outcome.ok and found:
            record.update(img_per_s=float(found.group(1)), conf=float(found.group(2)))
            print(f"n={n} e2e {system}: {record['img_per_s']:.1f} +-{record['conf']:.1f} img/sec", flush=True)
        else:
            record["error"] = outcome.error or "no 'Total img/sec' line in worker0's output"
            print(f"n={n} e2e {system} FAILED: {record['error'][:500]}", flush=True)
        self.results["e2e"].append(record)
        self.save()


def _listed(text: str) -> List[str]:
    """A comma-separated option's items; an empty option lists none."""
    return [item for item in text.split(",") if item]


def smoke(workdir: str) -> int:
    """2 hosts at 100 Mbit/s: the cap holds on an idle link, and a byteps job sums a tiny tensor."""
    rate = "100mbit"
    with ClusterRig(2, rate, tag="smoke") as rig:
        if "tbf" not in rig.qdisc(0):
            print(f"smoke: no tbf qdisc on host 0's NIC: {rig.qdisc(0)}", file=sys.stderr)
            return 1
        achieved = probe(rig, [(0, 1)], os.path.join(workdir, "probe"), seconds=1.0)[0]
        share = achieved / (parse_rate_bits(rate) / 8)
        print(f"smoke: one stream through a {rate} cap: {achieved / 1e6:.1f} MB/s ({share:.0%} of the cap)")
        if not 0.75 <= share <= 1.05:
            print("smoke: the cap does not hold (expected 75%-105% of it)", file=sys.stderr)
            return 1
        roles = layout("byteps-colocated", 2, ["--workload", "tiny", "--warmup", "1", "--repeats", "2"],
                       os.path.join(workdir, "byteps"), 9100, 1, rig.address)
        before = rig.link_counters()
        outcome = run_job(rig, roles, os.path.join(workdir, "byteps"), timeout=60)
        if not outcome.ok:
            print(f"smoke: byteps job failed: {outcome.error}", file=sys.stderr)
            return 1
        after = rig.link_counters()
        if not after["up_bytes"] > before["up_bytes"] or not after["down_bytes"] > before["down_bytes"]:
            print(f"smoke: the NICs' counters did not move ({before} -> {after})", file=sys.stderr)
            return 1
        times = [max(r["times"][i] for r in outcome.results) for i in range(2)]
        print(f"smoke: byteps push_pull on 2 hosts (servers co-located): OK, rounds {times[0]:.3f} s "
              f"{times[1]:.3f} s")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.render_only:
        with open(args.results) as f:
            render(args, json.load(f))
        return 0
    try:
        check_privileges()
    except RigError as exc:
        print(f"run_cluster_bench: {exc}", file=sys.stderr)
        return 2
    workdir = args.workdir or tempfile.mkdtemp(prefix="bps-cluster-")
    print(f"logs in {workdir}", flush=True)
    try:
        if args.smoke:
            return smoke(workdir)
        bench = Bench(args, workdir)
        bench.run()
        if not args.no_doc:
            render(args, bench.results)
    except RigError as exc:
        print(f"run_cluster_bench: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: rig torn down", file=sys.stderr)
        return 130
    failed = [m for m in bench.results["measurements"] + bench.results["e2e"] if m.get("error")]
    return 1 if failed else 0


def render(args: argparse.Namespace, results: dict) -> None:
    import report

    report.plot(results, args.plot)
    image_rel = os.path.relpath(args.plot, os.path.dirname(os.path.abspath(args.doc)))
    report.update_doc(args.doc, report.markdown(results), image_rel)
    print(f"wrote {args.doc}, {args.plot}, {args.results}")


def _summary(times: List[float]) -> Dict[str, float]:
    return {"median": statistics.median(times), "min": min(times), "max": max(times)}


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


if __name__ == "__main__":
    sys.exit(main())
