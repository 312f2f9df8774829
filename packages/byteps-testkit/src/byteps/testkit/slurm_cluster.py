"""A SLURM cluster for the launcher's tests: munged, slurmctld and slurmd(s), started and stopped here.

Debian's ``slurmctld``, ``slurmd``, ``slurm-client`` and ``munge`` packages
(the test session installs them); everything else lives in the test's
folder: a munge key and socket, ``slurm.conf`` (free ports,
``proctrack/linuxproc`` and ``task/none``, so no cgroups are needed),
state, spool and logs. The daemons run in the foreground as this process's
children and are stopped by their pids when the context ends, whatever
happened. :attr:`env` is what ``srun``/``sbatch`` need (``SLURM_CONF``).

One node (the default) is this machine as ``slurmd -C`` describes it. With
``nodes=N`` (root and ``ip`` needed; ``gpus_per_node`` gives each node
GPUs as SLURM counts them, see :meth:`_gpu_files`) every node is a network namespace of
the cluster's own (``n1`` .. ``nN``, 10.x.y.2.., on a bridge whose address
10.x.y.1 is slurmctld's, here), each with a slurmd of its own (``slurmd -N
nK``) in it: Debian's slurmd is not built for several daemons on one
network stack (``--enable-multiple-slurmd``), and a namespace is a host to
it. The nodes find each other by name through a hosts file bind-mounted
over /etc/hosts in the slurmds' mount namespace (``unshare --mount``; the
network is entered with ``nsenter --net``, which, unlike ``ip netns exec``,
leaves /sys and its cgroup mount as they are), which every task inherits.
Namespaces and bridge are deleted when the context ends, whatever happened.

Example::

    with SlurmCluster(tmp_path, nodes=2) as cluster:
        subprocess.run(["srun", "-N2", "hostname"], env={**os.environ, **cluster.env}, check=True)
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import stat
import subprocess
import time
from typing import Dict, List

from byteps.testkit.ports import free_port
from byteps.testkit.processes import stop_group

__all__ = ["SlurmCluster", "slurm_available", "SLURM_PROGRAMS"]

SLURM_PROGRAMS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/srun", "/usr/bin/sbatch")


def slurm_available() -> bool:
    return all(os.path.exists(program) for program in SLURM_PROGRAMS)


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of 10.0.0.0/8 that no interface here is on (other tests may run rigs of their own)."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    for number in range(os.getpid() % 200, os.getpid() % 200 + 200):
        subnet = ipaddress.ip_network(f"10.{150 + number % 100}.{number % 250}.0/24")
        if f" {subnet.network_address + 1}/" not in used and str(subnet.network_address)[:-1] not in used:
            return subnet
    raise RuntimeError("no free 10.x.y.0/24 for the SLURM nodes' network")


class SlurmCluster:
    """One node (this machine), or ``nodes`` nodes in network namespaces, in partition ``debug``."""

    def __init__(self, folder: str, nodes: int = 1, cpus_per_node: int = 2, gpus_per_node: int = 0) -> None:
        self.folder = os.path.abspath(str(folder))
        self.conf = os.path.join(self.folder, "slurm.conf")
        self.env: Dict[str, str] = {"SLURM_CONF": self.conf}
        self.nodes = nodes
        self.cpus_per_node = cpus_per_node
        self.gpus_per_node = gpus_per_node
        #: The nodes' names and addresses (several nodes only).
        self.addresses: Dict[str, str] = {}
        self._daemons: List[subprocess.Popen] = []
        self._tag = f"bs{os.getpid() % 100000}"  # network interface names are at most 15 characters
        self._namespaces: List[str] = []
        self._bridge = ""

    def _path(self, *parts: str) -> str:
        return os.path.join(self.folder, *parts)

    def __enter__(self) -> SlurmCluster:
        for sub in ("munge", "state", "spool", "log"):
            os.makedirs(self._path(sub), exist_ok=True)
        os.chmod(self._path("munge"), 0o700)
        with open(self._path("munge", "munge.key"), "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(self._path("munge", "munge.key"), 0o600)
        socket_path = self._path("munge", "munge.socket")
        try:
            if self.nodes == 1:
                node = subprocess.run(["/usr/sbin/slurmd", "-C"], capture_output=True, text=True, check=True).stdout
                node_line = next(line for line in node.splitlines() if line.startswith("NodeName="))
                controller = name = node_line.split()[0].split("=", 1)[1]
                node_lines = [" ".join(part for part in node_line.split() if not part.startswith("UpTime")) +
                              " State=UNKNOWN"]
                spool, pid_file, log_file = self._path("spool"), self._path("slurmd.pid"), "slurmd.log"
            else:
                controller = f"{socket.gethostname().split('.')[0]}({self._network()})"
                name = f"n[1-{self.nodes}]"
                gres = f" Gres=gpu:{self.gpus_per_node}" if self.gpus_per_node else ""
                node_lines = [f"NodeName={node} NodeAddr={address} CPUs={self.cpus_per_node} RealMemory=1000"
                              f"{gres} State=UNKNOWN" for node, address in self.addresses.items()]
                if self.gpus_per_node:
                    node_lines.insert(0, "GresTypes=gpu")
                    self._gpu_files()
                    with open(self._path("gres.conf"), "w") as f:
                        f.write(f"AutoDetect=off\nNodeName={name} Name=gpu "
                                f"File={self._path('dev', 'nvidia')}[0-{self.gpus_per_node - 1}]\n")
                spool, pid_file, log_file = self._path("spool", "%n"), self._path("slurmd-%n.pid"), "slurmd-%n.log"
                for node in self.addresses:
                    os.makedirs(self._path("spool", node), exist_ok=True)
            with open(self.conf, "w") as f:
                f.write("\n".join([
                    "ClusterName=bpstest", f"SlurmctldHost={controller}", f"SlurmctldPort={free_port()}",
                    f"SlurmdPort={free_port()}", "AuthType=auth/munge", f"AuthInfo=socket={socket_path}",
                    "CredType=cred/munge", "SlurmUser=root", "SlurmdUser=root",
                    f"StateSaveLocation={self._path('state')}", f"SlurmdSpoolDir={spool}",
                    f"SlurmctldPidFile={self._path('slurmctld.pid')}", f"SlurmdPidFile={pid_file}",
                    f"SlurmctldLogFile={self._path('log', 'slurmctld.log')}",
                    f"SlurmdLogFile={self._path('log', log_file)}",
                    "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
                    "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
                    "MpiDefault=none", "ReturnToService=2", "SchedulerType=sched/builtin",
                    "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "KillWait=5", *node_lines,
                    f"PartitionName=debug Nodes={name} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
                    ""]))
            self._start(["/usr/sbin/munged", "-F", "-f", "-S", socket_path,
                         f"--key-file={self._path('munge', 'munge.key')}",
                         f"--pid-file={self._path('munge', 'munged.pid')}",
                         f"--log-file={self._path('log', 'munged.log')}", f"--seed-file={self._path('munge', 'seed')}"],
                        "munged")
            self._wait(lambda: os.path.exists(socket_path), "munged's socket")
            self._start(["/usr/sbin/slurmctld", "-D", "-f", self.conf], "slurmctld")
            if self.nodes == 1:
                self._start(["/usr/sbin/slurmd", "-D", "-f", self.conf], "slurmd")
            for node, namespace in zip(self.addresses, self._namespaces):
                self._start(["unshare", "--mount", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"',
                             self._path("hosts"), "nsenter", f"--net=/run/netns/{namespace}", "/usr/sbin/slurmd",
                             "-D", "-N", node, "-f", self.conf], f"slurmd-{node}")
            self._wait(self._idle, "every node to be idle (sinfo)")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self, argv: List[str], name: str) -> None:
        with open(self._path("log", f"{name}.out"), "ab") as log:
            self._daemons.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                                  start_new_session=True, env={**os.environ, **self.env}))

    def _network(self) -> str:
        """Bridge, one namespace and veth pair per node, the hosts file; returns the controller's address."""
        subnet = _free_subnet()
        hosts = list(subnet.hosts())
        self._bridge = f"{self._tag}br"
        self._ip("link", "add", self._bridge, "type", "bridge")
        self._ip("addr", "add", f"{hosts[0]}/24", "dev", self._bridge)
        self._ip("link", "set", self._bridge, "up")
        for number in range(1, self.nodes + 1):
            namespace, veth = f"{self._tag}n{number}", f"{self._tag}v{number}"
            self._ip("netns", "add", namespace)
            self._namespaces.append(namespace)
            self._ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace)
            self._ip("link", "set", veth, "master", self._bridge, "up")
            self._ip("-n", namespace, "addr", "add", f"{hosts[number]}/24", "dev", "eth0")
            self._ip("-n", namespace, "link", "set", "eth0", "up")
            self._ip("-n", namespace, "link", "set", "lo", "up")
            self.addresses[f"n{number}"] = str(hosts[number])
        with open(self._path("hosts"), "w") as f:
            f.write("127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in self.addresses.items()))
        return str(hosts[0])

    def _gpu_files(self) -> None:
        """GPUs as SLURM counts them: slurmd wants a character device per GPU (gres.conf ``File=``) and
        reads no more than its name's number; these are /dev/null's numbers under GPU names, in the test's
        folder, never opened. A step that asks (``--gpus-per-node``) gets SLURM_GPUS_ON_NODE."""
        os.makedirs(self._path("dev"), exist_ok=True)
        for index in range(self.gpus_per_node):
            path = self._path("dev", f"nvidia{index}")
            if not os.path.exists(path):
                os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))

    @staticmethod
    def _ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    def _idle(self) -> bool:
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True,
                              env={**os.environ, **self.env})
        states = done.stdout.split()
        return len(states) == self.nodes and set(states) == {"idle"}

    def _wait(self, ready, what: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline or any(d.poll() is not None for d in self._daemons):
                logs = "".join(open(self._path("log", n), errors="replace").read()[-1500:]
                               for n in sorted(os.listdir(self._path("log"))))
                raise RuntimeError(f"the SLURM cluster did not come up (waiting for {what}):\n{logs}")
            time.sleep(0.1)

    def __exit__(self, *exc_info) -> None:
        for daemon in reversed(self._daemons):  # slurmd first, munged last
            stop_group(daemon, timeout=15)
        self._daemons.clear()
        for namespace in self._namespaces:  # its veth end goes with it
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        self._namespaces.clear()
        if self._bridge:
            subprocess.run(["ip", "link", "del", self._bridge], capture_output=True)
            self._bridge = ""
        shutil.rmtree(self._path("spool"), ignore_errors=True)
