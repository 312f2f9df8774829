"""A one-node SLURM cluster for the launcher's tests: munged, slurmctld and slurmd, started and stopped here.

Debian's ``slurmctld``, ``slurmd``, ``slurm-client`` and ``munge`` packages
(the test session installs them); everything else lives in the test's
folder: a munge key and socket, ``slurm.conf`` (the node as ``slurmd -C``
describes this machine, free ports, ``proctrack/linuxproc`` and
``task/none``, so no cgroups are needed), state, spool and logs. The three
daemons run in the foreground as this process's children and are stopped
by their pids when the context ends, whatever happened. :attr:`env` is what
``srun``/``sbatch`` need (``SLURM_CONF``).

Example::

    with SlurmCluster(tmp_path) as cluster:
        subprocess.run(["srun", "-n2", "hostname"], env={**os.environ, **cluster.env}, check=True)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Dict, List

from byteps.testkit.ports import free_port
from byteps.testkit.processes import stop_group

__all__ = ["SlurmCluster", "slurm_available", "SLURM_PROGRAMS"]

SLURM_PROGRAMS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/srun", "/usr/bin/sbatch")


def slurm_available() -> bool:
    return all(os.path.exists(program) for program in SLURM_PROGRAMS)


class SlurmCluster:
    """One node (this machine) with all its CPUs in partition ``debug``."""

    def __init__(self, folder: str) -> None:
        self.folder = os.path.abspath(str(folder))
        self.conf = os.path.join(self.folder, "slurm.conf")
        self.env: Dict[str, str] = {"SLURM_CONF": self.conf}
        self._daemons: List[subprocess.Popen] = []

    def _path(self, *parts: str) -> str:
        return os.path.join(self.folder, *parts)

    def __enter__(self) -> SlurmCluster:
        for sub in ("munge", "state", "spool", "log"):
            os.makedirs(self._path(sub), exist_ok=True)
        os.chmod(self._path("munge"), 0o700)
        with open(self._path("munge", "munge.key"), "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(self._path("munge", "munge.key"), 0o600)
        node = subprocess.run(["/usr/sbin/slurmd", "-C"], capture_output=True, text=True, check=True).stdout
        node_line = next(line for line in node.splitlines() if line.startswith("NodeName="))
        name = node_line.split()[0].split("=", 1)[1]
        socket_path = self._path("munge", "munge.socket")
        with open(self.conf, "w") as f:
            f.write("\n".join([
                "ClusterName=bpstest", f"SlurmctldHost={name}", f"SlurmctldPort={free_port()}",
                f"SlurmdPort={free_port()}", "AuthType=auth/munge", f"AuthInfo=socket={socket_path}",
                "CredType=cred/munge", "SlurmUser=root", "SlurmdUser=root",
                f"StateSaveLocation={self._path('state')}", f"SlurmdSpoolDir={self._path('spool')}",
                f"SlurmctldPidFile={self._path('slurmctld.pid')}", f"SlurmdPidFile={self._path('slurmd.pid')}",
                f"SlurmctldLogFile={self._path('log', 'slurmctld.log')}",
                f"SlurmdLogFile={self._path('log', 'slurmd.log')}",
                "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
                "AccountingStorageType=accounting_storage/none", "MpiDefault=none", "ReturnToService=2",
                "SchedulerType=sched/builtin", "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
                "KillWait=5", " ".join(part for part in node_line.split() if not part.startswith("UpTime")) +
                " State=UNKNOWN",
                f"PartitionName=debug Nodes={name} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES", ""]))
        try:
            self._start(["/usr/sbin/munged", "-F", "-f", "-S", socket_path,
                         f"--key-file={self._path('munge', 'munge.key')}",
                         f"--pid-file={self._path('munge', 'munged.pid')}",
                         f"--log-file={self._path('log', 'munged.log')}", f"--seed-file={self._path('munge', 'seed')}"],
                        "munged")
            self._wait(lambda: os.path.exists(socket_path), "munged's socket")
            self._start(["/usr/sbin/slurmctld", "-D", "-f", self.conf], "slurmctld")
            self._start(["/usr/sbin/slurmd", "-D", "-f", self.conf], "slurmd")
            self._wait(self._idle, "the node to be idle (sinfo)")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self, argv: List[str], name: str) -> None:
        with open(self._path("log", f"{name}.out"), "ab") as log:
            self._daemons.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                                  start_new_session=True, env={**os.environ, **self.env}))

    def _idle(self) -> bool:
        done = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                              env={**os.environ, **self.env})
        return done.stdout.strip() == "idle"

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
        shutil.rmtree(self._path("spool"), ignore_errors=True)
