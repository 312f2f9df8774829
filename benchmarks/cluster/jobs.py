"""One job on the rig: which process runs on which host, with which role environment.

A *system* is one of the things the benchmark compares; :func:`layout` says
where its processes go for ``n`` workers. Hosts ``0..n-1`` are the worker
hosts, ``n..2n-1`` the CPU server hosts and the last host the scheduler's,
so every system of one ``n`` runs on the same rig. Every process gets the
environment a real multi-machine job gives it: DMLC_ROLE,
DMLC_PS_ROOT_URI/PORT, DMLC_NUM_WORKER, DMLC_NUM_SERVER, DMLC_WORKER_ID and
DMLC_INTERFACE=eth0, its host's NIC.

Example::

    roles = layout("byteps", 4, ["--workload", "100MB"], workdir, port, 8, rig.address)
    outcome = run_job(rig, roles, workdir, timeout=600)
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Dict, List, Optional

from cpu_sampler import CpuSampler
from rig import NIC, ClusterRig

__all__ = ["SYSTEMS", "DEFAULT_SYSTEMS", "Role", "JobOutcome", "layout", "run_job", "hosts_needed"]

HERE = os.path.dirname(os.path.abspath(__file__))
SYSTEMS = ("byteps", "byteps-1server", "byteps-colocated", "byteps-onebit", "byteps-torch",
           "byteps-torch-outofplace", "gloo", "mxnet")
DESCRIPTIONS = {
    "byteps": "byteps push_pull, n worker hosts + n CPU server hosts",
    "byteps-1server": "byteps push_pull, n worker hosts + 1 CPU server host",
    "byteps-colocated": "byteps push_pull, a server on each of the n worker hosts",
    "byteps-onebit": "byteps push_pull with onebit compression (scaling, error feedback), n + n CPU server hosts",
    "byteps-torch": "byteps.torch push_pull_async_inplace on torch tensors, n + n CPU server hosts",
    "byteps-torch-outofplace": "byteps.torch push_pull_async (a new tensor per result), n + n CPU server hosts",
    "gloo": "torch.distributed gloo all_reduce (ring), n hosts",
    "mxnet": "MXNet KVStore dist_sync (ps-lite), n worker hosts + n CPU server hosts",
}
SCHEDULER_PORT = 9000
#: The byteps systems whose servers are n hosts of their own.
DEDICATED = ("byteps", "byteps-onebit", "byteps-torch", "byteps-torch-outofplace")
#: bps_worker's --api of the systems that do not use byteps.common directly.
WORKER_API = {"byteps-torch": "torch", "byteps-torch-outofplace": "torch-outofplace"}
#: What a run without --systems compares (the torch-path systems are asked for by name).
DEFAULT_SYSTEMS = tuple(system for system in SYSTEMS if system not in WORKER_API)
#: BytePS's compression_params of the byteps-onebit system.
ONEBIT = '{"compressor": "onebit", "scaling": true, "ef": "vanilla"}'


@dataclasses.dataclass
class Role:
    name: str
    host: int
    argv: List[str]
    env: Dict[str, str]
    is_worker: bool


@dataclasses.dataclass
class JobOutcome:
    ok: bool
    error: str
    seconds: float
    results: List[dict]  # one per worker, from its --out file
    cpu: Dict[str, float]  # over the timed rounds: machine_busy (0..1), job_cores


def hosts_needed(n: int) -> int:
    return 2 * n + 1


def _servers(system: str, n: int) -> List[int]:
    if system in DEDICATED or system == "mxnet":
        return list(range(n, 2 * n))
    if system == "byteps-1server":
        return [n]
    if system == "byteps-colocated":
        return list(range(n))
    return []


def layout(system: str, n: int, worker_args: List[str], workdir: str, port: int, scheduler_host: int,
           address, python: str = sys.executable, mxnet_python: Optional[str] = None,
           worker_script: Optional[str] = None, trace: bool = False,
           extra_env: Optional[Dict[str, str]] = None) -> List[Role]:
    """The processes of ``system`` with ``n`` workers; ``address(host)`` gives a host's IPv4 address.

    Workers run ``worker_script`` (default: this system's benchmark worker)
    with ``worker_args``; the benchmark workers also get ``--out`` (their
    result file) and gloo workers ``--master`` (rank 0's rendezvous).
    """
    if system not in SYSTEMS:
        raise ValueError(f"unknown system {system!r}; known: {', '.join(SYSTEMS)}")
    servers = _servers(system, n)
    common = {"DMLC_PS_ROOT_URI": address(scheduler_host), "DMLC_PS_ROOT_PORT": str(port),
              "DMLC_NUM_WORKER": str(n), "DMLC_NUM_SERVER": str(len(servers)), "DMLC_INTERFACE": NIC,
              **(extra_env or {})}
    per_host = (lambda host: {"DMLC_NODE_HOST": address(host)}) if system == "mxnet" else (lambda host: {})
    interpreter = mxnet_python if system == "mxnet" else python
    if system == "mxnet" and not mxnet_python:
        raise ValueError("the mxnet system needs --mxnet-python (a venv with mxnet 1.9.1)")
    default_script = {"gloo": "gloo_worker.py", "mxnet": "mxnet_worker.py"}.get(system, "bps_worker.py")
    roles: List[Role] = []
    if servers:
        # MXNet's scheduler and servers are `import mxnet` with their DMLC_ROLE; byteps' are byteps-server.
        server_argv = [interpreter, os.path.join(HERE, "mxnet_worker.py" if system == "mxnet" else "bps_server.py")]
        roles.append(Role("scheduler", scheduler_host, server_argv,
                          {**common, **per_host(scheduler_host), "DMLC_ROLE": "scheduler"}, False))
        for s, host in enumerate(servers):
            env = {**common, **per_host(host), "DMLC_ROLE": "server"}
            if trace:
                env["BENCH_TRACE"] = os.path.join(workdir, f"trace-server{s}.json")
            roles.append(Role(f"server{s}", host, server_argv, env, False))
    for w in range(n):
        argv = [interpreter, worker_script or os.path.join(HERE, default_script), *worker_args]
        if worker_script is None:
            argv += ["--out", os.path.join(workdir, f"worker{w}.json")]
        if system == "gloo":
            argv += ["--master", f"{address(0)}:{port}"]
        if system == "byteps-onebit":
            argv += ["--compression-params", ONEBIT]
        if system in WORKER_API:
            argv += ["--api", WORKER_API[system]]
        if trace:
            argv += ["--trace", os.path.join(workdir, f"trace-worker{w}.json")]
        roles.append(Role(f"worker{w}", w, argv, {**common, **per_host(w), "DMLC_ROLE": "worker",
                                                  "DMLC_WORKER_ID": str(w)}, True))
    return roles


def _base_env() -> Dict[str, str]:
    """This process's environment without job variables, plus one thread per process (2 cores for all)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "BYTEPS_", "PS_", "MXNET_"))}
    env.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    return env


def run_job(rig: ClusterRig, roles: List[Role], workdir: str, timeout: float, grace: float = 20.0,
            collect: bool = True) -> JobOutcome:
    """Start every role on its host, wait for the workers, collect their results; nothing outlives it.

    With ``collect`` each worker's ``--out`` file is read (and the CPU use of
    its timed rounds computed); without, the caller reads the logs.
    """
    os.makedirs(workdir, exist_ok=True)
    base = _base_env()
    started = time.monotonic()
    procs = {}
    sampler = CpuSampler()
    try:
        sampler.__enter__()
        for role in roles:
            procs[role.name] = rig.spawn(role.host, role.argv, {**base, **role.env},
                                         os.path.join(workdir, f"{role.name}.log"))
            sampler.pids.append(procs[role.name].pid)
        deadline = started + timeout
        error = ""
        workers_done_at = None
        while True:
            codes = {name: p.poll() for name, p in procs.items()}
            failed = [name for name, code in codes.items() if code not in (None, 0)]
            if failed:
                error = "; ".join(f"{name} exited {codes[name]}: {_tail(workdir, name)}" for name in failed)
                break
            if all(codes[r.name] is not None for r in roles if r.is_worker):
                workers_done_at = workers_done_at or time.monotonic()
                if all(code is not None for code in codes.values()):
                    break
                if time.monotonic() - workers_done_at > grace:
                    break  # servers that linger after the job are not the measurement's business
            if time.monotonic() > deadline:
                running = [name for name, code in codes.items() if code is None]
                error = f"timed out after {timeout:.0f} s; still running: {', '.join(running)}; " + \
                    "; ".join(f"{name}: {_tail(workdir, name)}" for name in running[:3])
                break
            time.sleep(0.1)
    finally:
        sampler.__exit__(None, None, None)
        rig.forget(list(procs.values()))
    results, cpu = [], {}
    if not error and collect:
        for role in roles:
            if role.is_worker:
                with open(os.path.join(workdir, f"{role.name}.json")) as f:
                    results.append(json.load(f))
        timed = [(r["starts"][0], max(s + t for s, t in zip(r["starts"], r["times"]))) for r in results
                 if r["times"]]
        if timed:
            cpu = sampler.window(min(b for b, _ in timed), max(e for _, e in timed))
    return JobOutcome(not error, error, time.monotonic() - started, results, cpu)


def _tail(workdir: str, name: str, chars: int = 600) -> str:
    try:
        with open(os.path.join(workdir, f"{name}.log"), errors="replace") as f:
            return f.read()[-chars:].strip().replace("\n", " | ")
    except OSError:
        return "(no log)"
