"""A cluster on one machine: hosts as network namespaces with capped NICs.

Each simulated host is a network namespace with one NIC, ``eth0``, the end
of a veth pair whose other end sits on a bridge in a namespace of its own.
Both ends carry a ``tc tbf`` qdisc at the same rate, so a host's upload
(its ``eth0``) and its download (the bridge side) are each capped, as a
real NIC is. Addresses (10.77.0.0/16) exist only inside those namespaces.

Namespaces are named ``bpsc<pid>-...`` after the process that made them, so
runs side by side never touch each other's hosts, and a rig left behind by
a crashed run (its pid gone) is found and deleted before a new one starts.
The rig is torn down on exit, on an exception and on SIGINT/SIGTERM.

Example (as root)::

    with ClusterRig(num_hosts=2, rate="500mbit") as rig:
        proc = rig.spawn(0, ["python", "-c", "print('hello from host 0')"], {}, log_path)
        print(rig.address(1))          # 10.77.0.2
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import subprocess
import time
from typing import Dict, List, Optional, Sequence

__all__ = ["ClusterRig", "RigError", "check_privileges", "clean_stale", "delete_rigs_of", "parse_rate_bits"]

PREFIX = "bpsc"
NIC = "eth0"
SUBNET = "10.77"
# tbf: a bucket large enough for GSO segments at these rates, a queue of 100 ms (as ENVIRONMENT.md).
TBF_BURST = "256kb"
TBF_LATENCY = "100ms"
#: The counters line of ``tc -s qdisc show``: " Sent 123 bytes 4 pkt (dropped 0, overlimits 5 requeues 0)".
_TBF_STATS = re.compile(r"Sent (\d+) bytes \d+ pkt \(dropped (\d+), overlimits (\d+)")


class RigError(RuntimeError):
    """The rig cannot be built here (not root, no ``ip netns``, a failed command)."""


def parse_rate_bits(rate: str) -> float:
    """'500mbit' -> 5e8 bits/s (tc's units: bit, kbit, mbit, gbit; decimal)."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*(bit|kbit|mbit|gbit)?\s*", rate.lower())
    if not match:
        raise ValueError(f"rate {rate!r}: expected e.g. 500mbit, 1gbit, 200000kbit")
    scale = {"bit": 1, None: 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[match.group(2)]
    return float(match.group(1)) * scale


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RigError(f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def check_privileges() -> None:
    """Raise RigError saying why this machine cannot host the rig."""
    if os.geteuid() != 0:
        raise RigError("the cluster rig needs root (network namespaces, veth, tc); run it as root")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise RigError(f"the cluster rig needs `{tool}` (iproute2), which is not on PATH")
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = _run(["ip", "netns", "add", probe], check=False)
    if made.returncode != 0:
        raise RigError(f"`ip netns add` is not available here: {made.stderr.strip()}")
    _run(["ip", "netns", "del", probe], check=False)


def _namespaces() -> List[str]:
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _delete_namespace(name: str) -> None:
    """Kill whatever still runs in a namespace, then delete it."""
    for _ in range(3):
        pids = [int(p) for p in _run(["ip", "netns", "pids", name], check=False).stdout.split()]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    _run(["ip", "netns", "del", name], check=False)


def clean_stale() -> List[str]:
    """Delete the namespaces of rigs whose creating process is gone; returns their names."""
    stale = []
    for name in _namespaces():
        match = re.fullmatch(rf"{PREFIX}(\d+)-.+", name)
        if match and int(match.group(1)) != os.getpid() and not _pid_alive(int(match.group(1))):
            _delete_namespace(name)
            stale.append(name)
    return stale


def delete_rigs_of(pid: int) -> List[str]:
    """Delete every namespace made by process ``pid`` (e.g. a benchmark a test had to kill)."""
    gone = [name for name in _namespaces() if name.startswith(f"{PREFIX}{pid}-")]
    for name in gone:
        _delete_namespace(name)
    return gone


@dataclasses.dataclass
class Host:
    index: int
    namespace: str
    address: str


class ClusterRig:
    """``num_hosts`` hosts on one bridge, every NIC capped at ``rate`` both ways."""

    def __init__(self, num_hosts: int, rate: str = "500mbit", tag: str = "") -> None:
        if num_hosts < 1 or num_hosts > 250:
            raise ValueError(f"num_hosts must be 1..250, got {num_hosts}")
        self.rate = rate
        self.rate_bits = parse_rate_bits(rate)
        base = f"{PREFIX}{os.getpid()}-{tag}" if tag else f"{PREFIX}{os.getpid()}-"
        self.bridge_ns = base + "br"
        self.hosts = [Host(i, f"{base}h{i}", f"{SUBNET}.0.{i + 1}") for i in range(num_hosts)]
        self._procs: List[subprocess.Popen] = []
        self._up = False
        self._old_handlers: Dict[int, object] = {}

    # --- building and tearing down ------------------------------------------------
    def __enter__(self) -> ClusterRig:
        self.up()
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> None:
        check_privileges()
        clean_stale()
        self._install_signal_handlers()
        self._up = True
        try:
            _run(["ip", "netns", "add", self.bridge_ns])
            self._in(self.bridge_ns, "ip", "link", "set", "lo", "up")
            self._in(self.bridge_ns, "ip", "link", "add", "br0", "type", "bridge")
            self._in(self.bridge_ns, "ip", "link", "set", "br0", "up")
            for host in self.hosts:
                self._add_host(host)
        except BaseException:
            self.down()
            raise

    def _add_host(self, host: Host) -> None:
        port = f"h{host.index}"
        _run(["ip", "netns", "add", host.namespace])
        # Both ends are created straight inside their namespaces: no name ever
        # appears in the root namespace, so concurrent rigs cannot clash.
        _run(["ip", "link", "add", NIC, "netns", host.namespace, "type", "veth",
              "peer", "name", port, "netns", self.bridge_ns])
        self._in(host.namespace, "ip", "link", "set", "lo", "up")
        self._in(host.namespace, "ip", "addr", "add", f"{host.address}/16", "dev", NIC)
        self._in(host.namespace, "ip", "link", "set", NIC, "up")
        self._in(self.bridge_ns, "ip", "link", "set", port, "master", "br0")
        self._in(self.bridge_ns, "ip", "link", "set", port, "up")
        # Upload cap on the host's NIC, download cap on the bridge's side of the cable.
        self._cap(host, self.rate)

    def down(self) -> None:
        """Kill every process started on the rig and delete its namespaces (idempotent)."""
        for proc in self._procs:
            _kill_group(proc)
        for proc in self._procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()
        if self._up:
            for host in self.hosts:
                _delete_namespace(host.namespace)
            _delete_namespace(self.bridge_ns)
            self._up = False
        self._restore_signal_handlers()

    def _install_signal_handlers(self) -> None:
        # SIGTERM and SIGHUP become exceptions, so `with`/finally blocks tear the rig down.
        def raise_exit(signum, frame):
            raise SystemExit(128 + signum)

        for signum in (signal.SIGTERM, signal.SIGHUP):
            try:
                self._old_handlers[signum] = signal.signal(signum, raise_exit)
            except ValueError:  # not the main thread: the caller handles signals
                pass

    def _restore_signal_handlers(self) -> None:
        for signum, handler in self._old_handlers.items():
            signal.signal(signum, handler)
        self._old_handlers.clear()

    @staticmethod
    def _in(namespace: str, *argv: str) -> subprocess.CompletedProcess:
        return _run(["ip", "netns", "exec", namespace, *argv])

    # --- using it -------------------------------------------------------------------
    def address(self, host: int) -> str:
        return self.hosts[host].address

    def namespace(self, host: int) -> str:
        return self.hosts[host].namespace

    def qdisc(self, host: int) -> str:
        """``tc qdisc show`` of a host's NIC (to check the cap is in place)."""
        return self._in(self.hosts[host].namespace, "tc", "qdisc", "show", "dev", NIC).stdout

    def link_counters(self) -> Dict[str, int]:
        """Every NIC's ``tbf`` counters summed over the hosts, both directions apart: bytes sent, packets
        dropped (the queue was full) and overlimits (packets made to wait), e.g. ``{"up_dropped": 3, ...}``.
        Two readings around a job give what its traffic did to the queues."""
        totals = {f"{side}_{name}": 0 for side in ("up", "down") for name in ("bytes", "dropped", "overlimits")}
        for host in self.hosts:
            for side, namespace, dev in (("up", host.namespace, NIC), ("down", self.bridge_ns, f"h{host.index}")):
                text = self._in(namespace, "tc", "-s", "qdisc", "show", "dev", dev).stdout
                found = _TBF_STATS.search(text)
                if found is None:
                    raise RigError(f"no tbf counters on {dev} in {namespace}: {text!r}")
                totals[f"{side}_bytes"] += int(found.group(1))
                totals[f"{side}_dropped"] += int(found.group(2))
                totals[f"{side}_overlimits"] += int(found.group(3))
        return totals

    def set_rate(self, rate: str) -> None:
        """Change every NIC's cap (both directions) in place."""
        self.rate, self.rate_bits = rate, parse_rate_bits(rate)
        for host in self.hosts:
            self._cap(host, rate)

    def _cap(self, host: Host, rate: str) -> None:
        for namespace, dev in ((host.namespace, NIC), (self.bridge_ns, f"h{host.index}")):
            self._in(namespace, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                     "burst", TBF_BURST, "latency", TBF_LATENCY)

    def spawn(self, host: int, argv: Sequence[str], env: Dict[str, str],
              log_path: Optional[str] = None) -> subprocess.Popen:
        """Start ``argv`` on a host, in a session of its own, killed at teardown."""
        out = open(log_path, "w") if log_path else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(["ip", "netns", "exec", self.hosts[host].namespace, *argv],
                                    env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            if log_path:
                out.close()
        self._procs.append(proc)
        return proc

    def forget(self, procs: Sequence[subprocess.Popen]) -> None:
        """Kill (if still running) and stop tracking processes of a finished job."""
        for proc in procs:
            _kill_group(proc)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            if proc in self._procs:
                self._procs.remove(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL a running process's session: it and anything it started.

    An exited (reaped) process is left alone, as its id may be reused;
    anything it left behind in a namespace dies when the rig deletes it.
    """
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
