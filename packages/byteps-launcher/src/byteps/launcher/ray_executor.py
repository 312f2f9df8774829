"""A byteps job on a Ray cluster: scheduler, servers and workers as Ray actors (``pip install byteps-launcher[ray]``).

In the manner of Horovod's ``horovod.ray.RayExecutor``::

    import ray
    from byteps.launcher.ray_executor import RayExecutor

    ray.init(address="auto")
    executor = RayExecutor(num_workers=4, num_servers=2, cpus_per_worker=2, cpus_per_server=1)
    executor.start()
    accuracies = executor.run(train, args=(config,))   # train() on every worker, its results in rank order
    executor.shutdown()

``start()`` places the scheduler and ``num_servers`` servers as actors
(``cpus_per_server`` CPUs each, so Ray puts them where CPUs are free, e.g.
on CPU-only nodes), each running ``python -m byteps.server`` with its role
environment, and ``num_workers`` worker actors. Each worker actor is a
worker machine of the job (``DMLC_WORKER_ID`` = its index, one process);
``run(fn)`` calls ``fn`` in every worker actor with that environment set,
so ``bps.init()`` inside it joins the job; ``fn`` should end with
``bps.shutdown()``. Every address is the node's IP as Ray knows it, the
scheduler's port a free one on its node, the job secret generated here and
handed to the actors (never on a command line).

A worker actor that dies (its node lost, ``ray.kill``), or a server or the
scheduler that exits, makes ``run`` raise within seconds with Ray's error
(``RayActorError``) or the process's exit status, after every actor of the
job was killed: nothing is left on any node. Every actor's process, and
every scheduler and server process, carries the job's ``BYTEPS_JOB_ID`` in
its environment (the actors through Ray's ``runtime_env``), so that what
is left of a job can be found by its id on every node. A job after
``shutdown()`` needs a new executor.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

import ray

from byteps.launcher.job_plan import job_identity, worker_variables

__all__ = ["RayExecutor", "ServiceExited", "start_services", "worker_environment", "stop_services"]

#: How often run() looks at the scheduler and servers while the workers train.
_HEALTH_CHECK_S = 1.0


class ServiceExited(RuntimeError):
    """The scheduler or a server of a Ray job exited while its workers were training."""


def _node_ip() -> str:
    """The address Ray knows this actor's node by (its --node-ip-address), which the other nodes reach."""
    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node["NodeID"] == node_id:
            return node["NodeManagerAddress"]
    return ray.util.get_node_ip_address()


@ray.remote(num_cpus=0)
class _Service:
    """One byteps scheduler or server process, on the node Ray placed this actor on."""

    def __init__(self) -> None:
        self.process: Optional[subprocess.Popen] = None

    def node_ip(self) -> str:
        return _node_ip()

    def free_port(self) -> int:
        with socket.socket() as sock:
            sock.bind((_node_ip(), 0))
            return sock.getsockname()[1]

    def start(self, env: Dict[str, str]) -> int:
        from byteps.launcher import _C

        parent = os.getpid()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "byteps.server"], env={**os.environ, **env}, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=lambda: _C.set_parent_death_signal(9, parent))
        return self.process.pid

    def poll(self) -> Optional[int]:
        return None if self.process is None else self.process.poll()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, 9)
            except ProcessLookupError:
                pass
            self.process.wait()


@ray.remote
class _Worker:
    """One worker machine of the job: runs the training function with byteps' environment."""

    def node_ip(self) -> str:
        return _node_ip()

    def setup(self, env: Dict[str, str]) -> None:
        os.environ.update(env)

    def execute(self, fn: Callable[..., Any], args: Sequence[Any], kwargs: Dict[str, Any]) -> Any:
        return fn(*args, **kwargs)

    def pid(self) -> int:
        return os.getpid()


def _carrying(job_id: str) -> Dict[str, Any]:
    """Actor options that put the job's id in the actor process's own environment (Ray starts it with it)."""
    return {"runtime_env": {"env_vars": {"BYTEPS_JOB_ID": job_id}}}


def start_services(num_workers: int, num_servers: int, cpus_per_server: float,
                   env: Optional[Dict[str, str]] = None) -> tuple:
    """The scheduler and ``num_servers`` servers as actors, started; returns (actors, the environment every
    worker shares: addresses, sizes, the job secret and id). The caller stops them (:func:`stop_services`).

    ValueError when the cluster has not the CPUs the servers ask for free now: their actors would wait
    for them forever."""
    free = ray.available_resources().get("CPU", 0)
    if num_servers * cpus_per_server > free:
        raise ValueError(f"the Ray cluster has {free:g} free CPUs, the byteps servers ask for "
                         f"{num_servers * cpus_per_server:g} ({num_servers} x {cpus_per_server:g}): add CPU nodes or "
                         "ask for fewer (num_servers, cpus_per_server)")
    identity = job_identity(env or {})
    scheduler = _Service.options(**_carrying(identity["BYTEPS_JOB_ID"])).remote()
    servers = [_Service.options(num_cpus=cpus_per_server, **_carrying(identity["BYTEPS_JOB_ID"])).remote()
               for _ in range(num_servers)]
    services = [scheduler, *servers]
    try:
        root, port = ray.get([scheduler.node_ip.remote(), scheduler.free_port.remote()])
        shared = {**(env or {}), "DMLC_PS_ROOT_URI": root, "DMLC_PS_ROOT_PORT": str(port),
                  "DMLC_NUM_WORKER": str(num_workers), "DMLC_NUM_SERVER": str(num_servers),
                  **identity, "PYTHONUNBUFFERED": "1"}
        ray.get(scheduler.start.remote({**shared, "DMLC_ROLE": "scheduler", "DMLC_NODE_HOST": root}))
        ips = ray.get([server.node_ip.remote() for server in servers])
        ray.get([server.start.remote({**shared, "DMLC_ROLE": "server", "DMLC_NODE_HOST": ip})
                 for server, ip in zip(servers, ips)])
    except BaseException:
        stop_services(services)
        raise
    return services, shared


def worker_environment(shared: Dict[str, str], rank: int, num_workers: int, node_ip: str) -> Dict[str, str]:
    """Worker ``rank``'s environment: a worker machine of its own, one process, on ``node_ip``."""
    return {**shared, "DMLC_ROLE": "worker", "DMLC_NODE_HOST": node_ip, **worker_variables(rank, num_workers, 0, 1)}


def check_services(services: List[Any]) -> None:
    """ServiceExited when the scheduler (first) or a server has exited."""
    codes = ray.get([service.poll.remote() for service in services])
    for index, code in enumerate(codes):
        if code not in (None, 0):
            role = "the scheduler" if index == 0 else f"server {index - 1}"
            raise ServiceExited(f"{role} of the byteps job exited with status {code}")


def stop_services(services: List[Any]) -> None:
    """Stop the byteps processes of ``services`` and kill the actors (safe on actors already gone)."""
    for service in services:
        try:
            ray.get(service.stop.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - the actor may be gone already; it is killed below
            pass
    for service in services:
        try:
            ray.kill(service)
        except Exception:  # noqa: BLE001 - already dead
            pass


class RayExecutor:
    """A byteps job's actors on the Ray cluster ``ray.init()`` connected to."""

    def __init__(self, num_workers: int, num_servers: int = 1, cpus_per_worker: float = 1,
                 cpus_per_server: float = 1, env: Optional[Dict[str, str]] = None) -> None:
        if num_workers < 1 or num_servers < 1:
            raise ValueError(f"num_workers and num_servers must be at least 1, got {num_workers}, {num_servers}")
        self.num_workers, self.num_servers = num_workers, num_servers
        self.cpus_per_worker, self.cpus_per_server = cpus_per_worker, cpus_per_server
        self.env = dict(env or {})
        self.services: List[Any] = []
        self.workers: List[Any] = []

    def _check_resources(self) -> None:
        available = ray.cluster_resources().get("CPU", 0)
        needed = self.num_workers * self.cpus_per_worker + self.num_servers * self.cpus_per_server
        if needed > available:
            raise ValueError(
                f"the Ray cluster has {available:g} CPUs, this job asks for {needed:g} ({self.num_workers} workers x "
                f"{self.cpus_per_worker:g} + {self.num_servers} servers x {self.cpus_per_server:g}): add nodes or ask "
                "for fewer (cpus_per_worker, cpus_per_server)")

    def start(self) -> None:
        """Place every actor and start the scheduler and servers; the workers wait for run()."""
        if not ray.is_initialized():
            raise RuntimeError("call ray.init() (address of your cluster) before RayExecutor.start()")
        self._check_resources()
        try:
            self.services, shared = start_services(self.num_workers, self.num_servers, self.cpus_per_server,
                                                   self.env)
            carrying = _carrying(shared["BYTEPS_JOB_ID"])
            self.workers = [_Worker.options(num_cpus=self.cpus_per_worker, **carrying).remote()
                            for _ in range(self.num_workers)]
            ips = ray.get([worker.node_ip.remote() for worker in self.workers])
            ray.get([worker.setup.remote(worker_environment(shared, rank, self.num_workers, ip))
                     for rank, (worker, ip) in enumerate(zip(self.workers, ips))])
        except BaseException:
            self.shutdown()
            raise

    def run(self, fn: Callable[..., Any], args: Sequence[Any] = (),
            kwargs: Optional[Dict[str, Any]] = None) -> List[Any]:
        """``fn(*args, **kwargs)`` on every worker; their results in rank order. Raises (after shutting the
        job down) when a worker raised or died, or when the scheduler or a server exited."""
        if not self.workers:
            raise RuntimeError("RayExecutor.run() before start() (or after shutdown())")
        refs = [worker.execute.remote(fn, tuple(args), dict(kwargs or {})) for worker in self.workers]
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=_HEALTH_CHECK_S)
                for ref in done:
                    ray.get(ref)  # raises RayActorError / RayTaskError at once
                if pending:
                    check_services(self.services)
            return ray.get(refs)
        except BaseException:
            self.shutdown()
            raise

    def shutdown(self) -> None:
        """Stop the servers and scheduler and kill every actor of the job (safe to call twice)."""
        stop_services(self.services)
        for worker in self.workers:
            try:
                ray.kill(worker)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self.workers, self.services = [], []
