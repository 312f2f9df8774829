"""Planning a job over several hosts reached by ssh (``bpslaunch -H host1:2,host2:2``).

Each listed host is a worker machine running ``slots`` worker processes
(every host must have the same number: a byteps job's machines all have
BYTEPS_LOCAL_SIZE local ranks). The scheduler runs on the first host.
Servers: ``--servers K`` puts K of them on the worker hosts, round-robin
(co-located, no extra machines); ``--server-hosts h3,h4`` puts one on each
of those dedicated CPU boxes. Every process gets the role environment a
hand-started multi-machine job would have (DMLC_ROLE, DMLC_PS_ROOT_URI =
the first host, DMLC_WORKER_ID, DMLC_NODE_HOST = its host, ...) plus one
job secret and job id; a child on another host gets only that and the
variables bpslaunch forwards (:data:`byteps.launcher.ssh.FORWARDED_PREFIXES`,
``-x NAME``), on top of its host's own environment. The processes of a
host named ``localhost`` (or this machine's name) start here, without ssh.

Example::

    plan = ssh_plan(parse_hosts("node1:2,node2:2"), ["python", "train.py"], os.environ, num_server=2)
"""

from __future__ import annotations

import secrets
from typing import Dict, List, Mapping, Optional, Sequence

from byteps.launcher.embedded_mode import OWNED_VARIABLES
from byteps.launcher.hosts import Host, is_local
from byteps.launcher.job_plan import (
    SERVER_ARGV,
    JobPlan,
    ProcessSpec,
    UsageError,
    child_environment,
    job_identity,
    worker_variables,
)
from byteps.launcher.ports import free_port
from byteps.launcher.ssh import SshOptions, forwarded_environment

__all__ = ["ssh_plan"]

#: The scheduler's port when its host is another machine (free ports there cannot be seen from here).
_REMOTE_PORTS = (20000, 40000)


def ssh_plan(hosts: Sequence[Host], command: Sequence[str], environ: Mapping[str, str],
             num_server: Optional[int] = None, server_hosts: Sequence[str] = (), port: Optional[int] = None,
             ssh: Optional[SshOptions] = None, forward: Sequence[str] = ()) -> JobPlan:
    """Plan a job over ``hosts``; raises UsageError or ConfigError (naming the variable)."""
    if not command:
        raise UsageError("missing COMMAND: what should each worker process run?")
    slots = {host.slots for host in hosts}
    if len(slots) != 1:
        raise UsageError("every host must run the same number of worker processes (a byteps job's machines "
                         f"share BYTEPS_LOCAL_SIZE); got {', '.join(f'{h.name}:{h.slots}' for h in hosts)}")
    if num_server is not None and server_hosts:
        raise UsageError("give --servers K (on the worker hosts) or --server-hosts (dedicated), not both")
    overlap = sorted(set(server_hosts) & {h.name for h in hosts})
    if overlap:
        raise UsageError(f"--server-hosts {','.join(overlap)} also run workers; use --servers K for servers on "
                         "the worker hosts")
    if num_server is not None and not 1 <= num_server <= len(hosts):
        raise UsageError(f"--servers {num_server}: between 1 and the {len(hosts)} worker hosts (one server per "
                         "host at most; more servers need --server-hosts)")
    server_places = list(server_hosts) or [hosts[i].name for i in range(num_server or len(hosts))]
    local_size, machines = slots.pop(), len(hosts)
    first = hosts[0].name
    if port is None:
        port = free_port() if is_local(first) else _REMOTE_PORTS[0] + secrets.randbelow(
            _REMOTE_PORTS[1] - _REMOTE_PORTS[0])
    base = {k: v for k, v in environ.items() if k not in OWNED_VARIABLES}
    shared = {
        "DMLC_PS_ROOT_URI": first,
        "DMLC_PS_ROOT_PORT": str(port),
        "DMLC_NUM_WORKER": str(machines),
        "DMLC_NUM_SERVER": str(len(server_places)),
        **job_identity(base),
    }
    remote_base = forwarded_environment(base, forward)

    def spec(role: str, host: str, argv: Sequence[str], extra: Dict[str, str], **rank) -> ProcessSpec:
        updates = {**shared, "DMLC_ROLE": role, "DMLC_NODE_HOST": host, **extra}
        if is_local(host):
            return ProcessSpec(role, tuple(argv), child_environment(base, updates), **rank)
        env = {k: v for k, v in child_environment(remote_base, updates).items() if k not in ("DMLC_INTERFACE",)}
        return ProcessSpec(role, tuple(argv), env, host=host, **rank)

    processes: List[ProcessSpec] = [spec("scheduler", first, SERVER_ARGV, {})]
    processes += [spec("server", host, SERVER_ARGV, {}, rank=i) for i, host in enumerate(server_places)]
    for machine, host in enumerate(hosts):
        for local_rank in range(local_size):
            extra = worker_variables(machine, machines, local_rank, local_size)
            processes.append(spec("worker", host.name, command, extra, rank=machine * local_size + local_rank,
                                  local_rank=local_rank))
    plan = JobPlan(mode="ssh", distributed=True, processes=tuple(processes), ssh=ssh or SshOptions())
    plan.validate()
    return plan
