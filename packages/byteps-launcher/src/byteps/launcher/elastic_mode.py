"""Elastic mode: ``bpslaunch -np 3 --min-np 2 --max-np 4 [--host-discovery-script S] COMMAND``.

Horovod's elastic launcher. Without a discovery script, or with one that
names only this machine, every worker process runs here and stands for a
host of one slot (the local form). A discovery script that names other
hosts (``node1:2``) gets workers started there over ssh, ``slots`` each,
as in ``-H`` jobs (:mod:`byteps.launcher.ssh`); they read the membership
from bpslaunch's rendezvous service (:mod:`byteps.launcher.rendezvous`)
instead of the epoch folder. Every elastic worker is one process of local
size 1: there is no local aggregation in elastic jobs.

The job runs as a series of membership epochs
(:mod:`byteps.common.elastic.membership`); each epoch has a fresh scheduler
and servers, on bpslaunch's machine, with a new port, job id and secret, so
nothing an older epoch's process sends is ever summed.

* A worker (or a server, or the scheduler) dies: the epoch ends at once.
  bpslaunch stops its scheduler, which tells every node (the survivors get
  ``JobLost``, Horovod's ``HorovodInternalError``, from the collective in
  flight), and publishes the next epoch with the surviving workers in their
  old order. The survivors roll back to their last commit and go on, as
  long as at least ``--min-np`` are left; else the job fails with the dead
  worker's exit status.
* The discovery script reports more slots (``localhost:3``, or a new host):
  bpslaunch starts new workers, up to ``--max-np``, and marks the epoch
  ``pending``. A host that fails the ssh check (unreachable, no byteps, another
  version) is left out with one line saying why; a host whose new worker
  fails before it was let in rests for REST_AFTER_FAILURE_S.
  At their next ``state.commit()`` the members leave it together
  (``HostsUpdatedInterrupt``); once all have said so, the next epoch
  includes the newcomers, who get the state by ``sync()``.
* The discovery script reports fewer slots on a host, or no longer names
  it: that host's newest members (never fewer than ``--min-np`` in all)
  leave at the members' next commit, the same way,
  and bpslaunch stops them (SIGTERM) once all have left the epoch.
* The job succeeds when every member has exited 0; workers still waiting
  to join then are stopped. Once a member has finished, the job is ending:
  a failure after that fails it.

Example::

    options = ElasticOptions(np=3, min_np=2, max_np=3)
    outcome = ElasticSupervisor(options, ["python", "train.py"], os.environ, console).run()
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Dict, List, Mapping, Optional, Sequence, Set

from byteps.common.config import Config, ConfigError
from byteps.common.elastic.held_tables import HELD_TABLE_DIR
from byteps.common.elastic.membership import (
    ELASTIC_DIR,
    ELASTIC_KEY,
    ELASTIC_RENDEZVOUS,
    ELASTIC_WORKER,
    Epoch,
    epoch_secret,
    leaving_members,
    write_epoch,
)
from byteps.common.interface import distribution_version
from byteps.common.job_report import REPORT_DIR_VARIABLE, read_reports
from byteps.common.shared_segment import sweep
from byteps.launcher.child_process import ChildProcess, describe_exit, exit_status
from byteps.launcher.embedded_mode import LOCALHOST, OWNED_VARIABLES
from byteps.launcher.hosts import Host, is_local, parse_host_lines
from byteps.launcher.job_plan import SERVER_ARGV, JobPlan, ProcessSpec, UsageError, child_environment, job_identity
from byteps.launcher.output import Console
from byteps.launcher.ports import free_port
from byteps.launcher.rendezvous import RendezvousService
from byteps.launcher.ssh import SshOptions, forwarded_environment, host_problems
from byteps.launcher.supervisor import DEFAULT_GRACE_PERIOD, TEARDOWN, Supervisor
from byteps.transport import TransportError
from byteps.transport.addressing import resolve_host

__all__ = ["ElasticOptions", "ElasticSupervisor", "discover_hosts", "DISCOVERY_INTERVAL_S", "NO_LIMIT",
           "REST_AFTER_FAILURE_S"]

#: How often the discovery script runs (Horovod polls its script about once a second too).
DISCOVERY_INTERVAL_S = 1.0
DISCOVERY_TIMEOUT_S = 10.0
#: ``max_np`` of a job with a discovery script and no --max-np: the script alone bounds it.
NO_LIMIT = 1 << 30
#: A host whose new worker failed before it was let in gets no new worker for this long (Horovod's
#: blacklist cooldown), however many slots discovery reports there.
REST_AFTER_FAILURE_S = 30.0


@dataclasses.dataclass(frozen=True)
class ElasticOptions:
    """The elastic command line: sizes, discovery, servers per epoch and how many changes a job may go through."""

    np: int
    min_np: int
    max_np: int
    discovery_script: Optional[str] = None
    num_server: int = 1
    reset_limit: Optional[int] = None  # None: no limit

    def check(self) -> None:
        if self.min_np < 1:
            raise UsageError(f"--min-np must be >= 1, got {self.min_np}")
        if self.min_np > self.max_np:
            raise UsageError(f"--min-np {self.min_np} is larger than --max-np {self.max_np}: the job could never "
                             "run; give --max-np >= --min-np")
        if not self.min_np <= self.np <= self.max_np:
            raise UsageError(f"-np {self.np} must lie between --min-np {self.min_np} and --max-np {self.max_np}")
        if self.num_server < 1:
            raise UsageError(f"--servers must be >= 1 in an elastic job, got {self.num_server}")
        if self.reset_limit is not None and self.reset_limit < 0:
            raise UsageError(f"--reset-limit must be >= 0, got {self.reset_limit}")


def discover_hosts(script: str, timeout_s: float = DISCOVERY_TIMEOUT_S) -> List[Host]:
    """Run the discovery script; the hosts it reports, in its order. UsageError naming what is wrong.

    The script prints one host per line, ``host:slots`` or ``host`` (one
    slot), as Horovod's does; this machine may be named ``localhost``,
    ``127.0.0.1`` or by its name, and its workers start without ssh.
    """
    try:
        result = subprocess.run([script], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise UsageError(f"--host-discovery-script {script} did not finish within {timeout_s:g} s") from None
    except OSError as exc:
        raise UsageError(f"--host-discovery-script {script} cannot be run: {exc.strerror}; give the path of an "
                         "executable script that prints host:slots lines") from None
    if result.returncode != 0:
        tail = result.stderr.strip().splitlines()[-1:] or ["(no output on stderr)"]
        raise UsageError(f"--host-discovery-script {script} {describe_exit(result.returncode)}: {tail[0]}")
    if not result.stdout.strip():
        return []
    return parse_host_lines(result.stdout.splitlines(), f"--host-discovery-script {script} output")


class ElasticSupervisor(Supervisor):
    """Runs an elastic job: workers that outlive epochs, and one scheduler and servers per epoch."""

    def __init__(self, options: ElasticOptions, command: Sequence[str], environ: Mapping[str, str],
                 console: Optional[Console] = None, grace_period: float = DEFAULT_GRACE_PERIOD,
                 ssh: Optional[SshOptions] = None, forward: Sequence[str] = (), **supervisor_options) -> None:
        options.check()
        if not command:
            raise UsageError("missing COMMAND: what should each worker process run?")
        super().__init__(JobPlan(mode="elastic", distributed=True, processes=(), ssh=ssh or SshOptions()),
                         grace_period=grace_period, console=console, **supervisor_options)
        self.options = options
        self.command = tuple(command)
        self.base_env = {k: v for k, v in environ.items() if k not in OWNED_VARIABLES}
        self.remote_env = forwarded_environment(self.base_env, forward)  # UsageError for an unknown -x NAME
        self.folder = tempfile.mkdtemp(prefix="bpslaunch-elastic-")  # 0700: the epoch file holds the secret
        self.key = secrets.token_hex(32)  # derives every epoch's secret; signs the rendezvous service's answers
        self.rendezvous: Optional[RendezvousService] = None  # started with the first worker on another host
        self.workers: Dict[str, ChildProcess] = {}  # live workers by their lasting name
        self.host_of: Dict[str, str] = {}  # every worker's host, as discovery names it
        self.waiting: List[str] = []  # started, not yet members of an epoch
        self.removing: List[str] = []  # members discovery no longer has slots for: they leave at the next commit
        self.finished: Set[str] = set()
        self.epoch: Optional[Epoch] = None
        self.services: List[ChildProcess] = []  # the current epoch's scheduler and servers
        self.retired: Dict[int, float] = {}  # pid of an older epoch's service -> when to SIGKILL it
        self.job_ids: Set[str] = set()
        self.resets = 0
        self.checked_hosts: Set[str] = set()  # other hosts that passed the ssh check
        self.failed_checks: Dict[str, str] = {}  # other hosts that failed it last: what is wrong
        self._checks: Dict[str, concurrent.futures.Future] = {}  # hosts being checked now
        self._checker = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="bpslaunch-check")
        self.resting: Dict[str, float] = {}  # host -> until when it gets no new worker
        self._next_worker = 0
        self._next_discovery = 0.0
        self._last_discovery_error = ""
        self._check_environment()
        self._initial = self._initial_hosts()

    # ------------------------------------------------------------ starting

    def _check_environment(self) -> None:
        """The user's BYTEPS_*/DMLC_* knobs, judged as a worker of the smallest epoch this job may have
        (--min-np workers, each a machine of its own, with servers) sees them. ConfigError; one that a
        larger --min-np would cure says so."""
        try:
            self._judge(self.options.min_np)
        except ConfigError as exc:
            try:
                self._judge(min(self.options.max_np, 1024))
            except ConfigError:
                raise exc from None
            raise ConfigError(exc.variable, f"{str(exc).split(': ', 1)[1]} (an epoch of this elastic job may have "
                              f"as few as --min-np {self.options.min_np} worker(s): give a larger --min-np)") from None

    def _judge(self, workers: int) -> None:
        """Config.from_env as a worker of an epoch of ``workers`` members sees it (ConfigError)."""
        members = tuple(f"w{i}" for i in range(workers))
        stand_in = Epoch(0, members, 1, self.options.num_server, "0" * 12, "x")
        Config.from_env({**self.base_env, "DMLC_ROLE": "worker", **stand_in.environment("w0")})

    def _initial_hosts(self) -> List[str]:
        """Where the first workers run: -np on this machine, or -np slots of the hosts discovery reports
        (fewer if it reports fewer, but at least --min-np: UsageError, naming the hosts left out)."""
        if not self.options.discovery_script:
            return ["localhost"] * self.options.np
        hosts = discover_hosts(self.options.discovery_script)
        usable = self._usable(hosts, wait=True)
        slots = sum(h.slots for h in usable)
        if slots < self.options.min_np:
            problems = "; ".join(f"{name}: {why}" for name, why in self.failed_checks.items())
            raise UsageError(f"--host-discovery-script {self.options.discovery_script} reports {slots} usable "
                             f"slot(s), fewer than --min-np {self.options.min_np}" + (f" ({problems})" if problems
                                                                                     else ""))
        return [name for name, count in self._wanted(usable, self.options.np).items() for _ in range(count)]

    def _usable(self, hosts: Sequence[Host], wait: bool = False) -> List[Host]:
        """``hosts`` that are this machine or passed the ssh check, and are not resting.

        A host that passes is not checked again; one that fails rests for
        REST_AFTER_FAILURE_S and is checked again after that, if discovery
        still names it. The check runs on a thread: while the job runs
        (``wait=False``), a host being checked is not usable yet, and the
        launcher goes on reaping and re-forming meanwhile (an unreachable
        host can take ssh's 10 s).
        """
        now = time.monotonic()
        unchecked = [h.name for h in hosts if not is_local(h.name) and h.name not in self.checked_hosts
                     and h.name not in self._checks and self.resting.get(h.name, 0.0) <= now]
        if unchecked:
            check = self._checker.submit(host_problems, unchecked, self.plan.ssh,
                                         distribution_version("byteps-launcher"))
            self._checks.update({name: check for name in unchecked})
        for name, check in list(self._checks.items()):
            if wait or check.done():
                problems = check.result()
                del self._checks[name]
                if name in problems:
                    self.failed_checks[name] = problems[name]
                    self.resting[name] = time.monotonic() + REST_AFTER_FAILURE_S
                    self.console.note(f"host {name}: {problems[name]}; starting no worker there for "
                                      f"{REST_AFTER_FAILURE_S:g} s")
                else:
                    self.failed_checks.pop(name, None)
                    self.checked_hosts.add(name)
        now = time.monotonic()
        return [h for h in hosts if (is_local(h.name) or h.name in self.checked_hosts)
                and self.resting.get(h.name, 0.0) <= now]

    def _wanted(self, hosts: Sequence[Host], most: int) -> Dict[str, int]:
        """Workers per host: each host's slots in the order given, ``most`` in all."""
        wanted: Dict[str, int] = {}
        for host in hosts:
            count = min(host.slots, most - sum(wanted.values()))
            if count > 0:
                wanted[host.name] = count
        return wanted

    def _start_all(self) -> None:
        for host in self._initial:
            if self._start_worker(host) is None:
                return
        self._start_epoch(list(self.waiting), "start")

    def run(self):  # type: ignore[override]
        try:
            return super().run()
        finally:
            self._checker.shutdown(wait=False)
            if self.rendezvous is not None:
                self.rendezvous.close()
            shutil.rmtree(self.folder, ignore_errors=True)

    def _start_worker(self, host: str) -> Optional[str]:
        name = f"w{self._next_worker}"
        # Server-held tables are saved at each commit where this machine's servers write them (the folder goes
        # at the end with the rest), unless the job names a folder of its own (byteps.common.elastic.held_tables)
        held = {} if self.base_env.get(HELD_TABLE_DIR, "").strip() else \
            {HELD_TABLE_DIR: os.path.join(self.folder, "held-tables")}
        if is_local(host):
            env = child_environment(self.base_env, {"DMLC_ROLE": "worker", ELASTIC_DIR: self.folder,
                                                    ELASTIC_WORKER: name, **held})
            spec = ProcessSpec("worker", self.command, env, rank=self._next_worker)
        else:
            if self.rendezvous is None:
                self.rendezvous = RendezvousService(self.folder, self.key, self._address_toward(host))
                self.rendezvous.start()
                self.console.note(f"rendezvous service for workers on other hosts on {self.rendezvous.address}")
            env = child_environment(self.remote_env, {"DMLC_ROLE": "worker", "DMLC_NODE_HOST": host,
                                                      ELASTIC_RENDEZVOUS: self.rendezvous.address,
                                                      ELASTIC_KEY: self.key, ELASTIC_WORKER: name, **held})
            spec = ProcessSpec("worker", self.command, env, rank=self._next_worker, host=host)
        self._next_worker += 1
        child = self._spawn(spec)
        if child is None:
            return None
        self.workers[name] = child
        self.host_of[name] = host
        self.waiting.append(name)
        return name

    def _address_toward(self, host: str) -> str:
        """The address of this machine that ``host`` reaches (UsageError when there is no route)."""
        try:
            return resolve_host(None, None, host)
        except TransportError as exc:
            raise UsageError(f"no route from this machine to {host}: {exc}") from None

    def _start_epoch(self, members: List[str], why: str) -> None:
        number = 0 if self.epoch is None else self.epoch.number + 1
        identity = job_identity({})
        remote = [self.host_of[m] for m in members if not is_local(self.host_of[m])]
        address = self._address_toward(remote[0]) if remote else LOCALHOST
        epoch = Epoch(number=number, members=tuple(members), root_port=free_port(address),
                      num_server=self.options.num_server, job_id=identity["BYTEPS_JOB_ID"],
                      secret=epoch_secret(self.key, identity["BYTEPS_JOB_ID"]), root_uri=address)
        self.job_ids.add(epoch.job_id)
        shared = {"DMLC_PS_ROOT_URI": address, "DMLC_PS_ROOT_PORT": str(epoch.root_port),
                  "DMLC_NUM_WORKER": str(len(members)), "DMLC_NUM_SERVER": str(epoch.num_server),
                  "DMLC_NODE_HOST": address, "BYTEPS_JOB_ID": epoch.job_id, "BYTEPS_JOB_SECRET": epoch.secret}
        if address == LOCALHOST:
            shared["DMLC_INTERFACE"] = "lo"
        self.services = []
        roles = [("scheduler", None)] + [("server", i) for i in range(epoch.num_server)]
        reports = self._epoch_report_dir(number)
        if reports is not None:
            os.makedirs(reports, exist_ok=True)
            shared[REPORT_DIR_VARIABLE] = reports
        for role, index in roles:
            env = child_environment(self.base_env, {**shared, "DMLC_ROLE": role})
            if role == "scheduler":  # a hung worker never exits: the scheduler says which one it presumed dead
                env["BYTEPS_LOST_NODE_FILE"] = self._lost_node_file(number)
            child = self._spawn(ProcessSpec(role, SERVER_ARGV, env, rank=index))
            if child is None:
                return
            self.services.append(child)
        self.epoch = epoch
        self.waiting = [w for w in self.waiting if w not in members]
        write_epoch(self.folder, epoch)
        hosts = sorted({self.host_of[m] for m in members})
        on = f" on {len(hosts)} host(s) {', '.join(hosts)}" if remote else ""
        self.console.note(f"membership epoch {number} ({why}): {len(members)} worker(s) "
                          f"{', '.join(members)}{on}, scheduler on {address}:{epoch.root_port}")

    def _epoch_report_dir(self, number: int) -> Optional[str]:
        """Where epoch ``number``'s servers write their reports (a folder of its own: every epoch has a
        server 0), or None when bpslaunch asked for none."""
        base = self.base_env.get(REPORT_DIR_VARIABLE, "").strip()
        return os.path.join(base, f"epoch-{number}") if base else None

    def async_pushes_by_epoch(self) -> Dict[int, int]:
        """The asynchronous pushes (BYTEPS_ENABLE_ASYNC) each epoch's servers applied, for the epochs whose
        servers wrote their reports: those that ended cleanly (a change at a commit, the job's end), not
        one that lost a process, whose servers end with it."""
        applied: Dict[int, int] = {}
        for number in range(self.epoch.number + 1 if self.epoch is not None else 0):
            folder = self._epoch_report_dir(number)
            found = read_reports(folder) if folder and os.path.isdir(folder) else []
            servers = [r for r in found if r.role == "server"]
            if servers:
                applied[number] = sum(r.async_pushes for r in servers)
        return applied

    # -------------------------------------------------------------- events

    def _on_exit(self, child: ChildProcess) -> None:
        if self._phase == TEARDOWN:
            return
        returncode = child.returncode
        if child.pid in self.retired:
            self.retired.pop(child.pid)
            return
        if child in self.services:
            self._on_service_exit(child, returncode)
            return
        name = next((n for n, c in self.workers.items() if c is child), None)
        if name is None:
            return
        del self.workers[name]
        if returncode == 0:
            self.finished.add(name)
            return
        host = self.host_of[name]
        reason = f"worker {name}" + ("" if is_local(host) else f" on {host}") + f" {describe_exit(returncode)}"
        if name in self.waiting:
            self.waiting.remove(name)
            self.resting[host] = time.monotonic() + REST_AFTER_FAILURE_S
            self.console.note(f"{reason} before it was let into the job; no new worker on {host} for "
                              f"{REST_AFTER_FAILURE_S:g} s")
            return
        self._membership_lost(reason, exit_status(returncode) or 1)

    def _on_service_exit(self, child: ChildProcess, returncode: int) -> None:
        self.services.remove(child)
        if returncode != 0:
            self._membership_lost(f"{child.spec.label} of epoch {self.epoch.number} {describe_exit(returncode)}",
                                  exit_status(returncode) or 1)

    def _change_membership(self) -> None:
        """Once every live member has left the epoch for the next one (at the commit that saw `pending`),
        stop the workers being removed and start the next epoch with the rest and the newcomers."""
        members = self._members_alive()
        if not members or not set(members) <= leaving_members(self.folder, self.epoch.number):
            return
        if not self._may_reset("the membership changes", 1):
            return
        for name in self.removing:
            child = self.workers.pop(name, None)
            if child is not None:
                self._tree.signal(child, signal.SIGTERM)
        kept = [m for m in members if m not in self.removing]
        why = "workers joined" if self.waiting else "workers removed"
        if self.waiting and self.removing:
            why = "workers joined and removed"
        self.removing = []
        self._retire_services(immediately=False)
        self._start_epoch(kept + self.waiting, why)

    def _members_alive(self) -> List[str]:
        return [m for m in self.epoch.members if m in self.workers]

    def _lost_node_file(self, number: int) -> str:
        return os.path.join(self.folder, f"lost.{number}.json")

    def _stop_presumed_dead(self) -> None:
        """The worker this epoch's scheduler presumed dead (no heartbeat), if its process still runs: SIGKILL it
        and count it lost. A hung process (or a host cut off while its ssh session lingers) never exits by
        itself, and a next epoch that waited for it would never assemble."""
        try:
            with open(self._lost_node_file(self.epoch.number)) as f:
                lost = json.load(f)
        except (OSError, ValueError):
            return
        if lost.get("role") != "worker" or not 0 <= int(lost.get("worker_id", -1)) < len(self.epoch.members):
            return
        name = self.epoch.members[int(lost["worker_id"])]
        child = self.workers.pop(name, None)
        if child is not None:
            self.console.note(f"worker {name}: {lost.get('why', 'presumed dead by the scheduler')}; stopping it "
                              "(SIGKILL) and going on without it")
            self._tree.signal(child, signal.SIGKILL)

    def _membership_lost(self, reason: str, code: int) -> None:
        if self.finished:  # the job was ending: no new epoch for it
            self._fail(f"{reason} after worker(s) {', '.join(sorted(self.finished))} had finished", code)
            return
        self._stop_presumed_dead()
        survivors = self._members_alive()
        if len(survivors) < self.options.min_np:
            self._fail(f"{reason}; {len(survivors)} worker(s) left, fewer than --min-np {self.options.min_np}",
                       code)
            return
        if not self._may_reset(reason, code):
            return
        self.removing = []  # the next discovery decides again, for the new membership
        self.console.note(f"{reason}; going on with {len(survivors)} worker(s) from their last commit")
        self._retire_services(immediately=True)
        self._start_epoch(survivors + self.waiting, "a process was lost")

    def _may_reset(self, reason: str, code: int) -> bool:
        """Count one change of membership; False (and the job failing) past --reset-limit."""
        if self.options.reset_limit is not None and self.resets >= self.options.reset_limit:
            self._fail(f"{reason}; the job already changed membership {self.resets} time(s) "
                       f"(--reset-limit {self.options.reset_limit})", code)
            return False
        self.resets += 1
        return True

    def _retire_services(self, immediately: bool) -> None:
        """End the current epoch's scheduler and servers; SIGKILL what is left after the grace period."""
        deadline = time.monotonic() + self.grace_period
        for child in self.services:
            if child.running:
                self.retired[child.pid] = deadline
        if immediately:  # its scheduler tells every node before it exits (NODE_FAILED)
            for child in self.services:
                if child.running and child.spec.role == "scheduler":
                    self._tree.signal(child, signal.SIGTERM)
        self.services = []

    def _timeout(self) -> float:
        return min(super()._timeout(), 0.1)  # the epoch file and the announcements are polled

    def _check_progress(self) -> None:
        now = time.monotonic()
        for child in self._tree.running():
            if child.pid in self.retired and now >= self.retired[child.pid]:
                self._tree.signal(child, signal.SIGKILL)
        if self.finished and not self._members_alive():
            self._finish()  # workers still waiting to be let in have nothing left to join
            return
        if self.epoch is not None and self.epoch.pending and not self.finished:
            self._change_membership()
        if self.options.discovery_script and not self.finished and now >= self._next_discovery:
            self._next_discovery = now + DISCOVERY_INTERVAL_S
            self._discover()

    def _finish(self) -> None:
        """Every member exited 0: give the services the grace period to stop on their own, then end."""
        for name in self.waiting:
            self.console.note(f"worker {name} was still waiting to join when the job finished; stopping it")
            self._tree.signal(self.workers.pop(name), signal.SIGTERM)
        self.waiting = []
        services = self._tree.running()
        if not services:
            self._begin_teardown(None)
        elif self._deadline is None:
            self._deadline = time.monotonic() + self.grace_period
        elif time.monotonic() >= self._deadline:
            self._begin_teardown(f"{len(services)} service process(es) still running {self.grace_period:g} s "
                                 "after all workers finished; terminating")

    def _discover(self) -> None:
        try:
            hosts = discover_hosts(self.options.discovery_script)
        except UsageError as exc:
            if str(exc) != self._last_discovery_error:
                self.console.note(f"{exc}; keeping the current workers")
                self._last_discovery_error = str(exc)
            return
        self._last_discovery_error = ""
        if self.epoch is None or self.epoch.pending:
            return  # one change at a time
        slots = sum(h.slots for h in hosts)
        wanted = self._wanted(self._usable(hosts), self.options.max_np)
        resting = {name for name, until in self.resting.items() if until > time.monotonic()}
        started, removing = [], []
        for host, count in wanted.items():
            for _ in range(count - self._workers_on(host)):
                name = self._start_worker(host)
                if name is None:
                    return
                started.append(name)
        # The newest members of each host that has more than discovery reports go first (never below
        # --min-np), so the oldest, and rank 0, stay. A resting host keeps what it has.
        members = sorted(self._members_alive(), key=lambda name: int(name[1:]))
        spare = len(members) - self.options.min_np
        for host in sorted({self.host_of[m] for m in members} - resting):
            extra = self._workers_on(host) - wanted.get(host, 0)
            on_host = [m for m in members if self.host_of[m] == host]
            for name in on_host[::-1][:max(0, min(extra, spare))]:
                removing.append(name)
                spare -= 1
        if started:
            self.console.note(f"discovery reports {slots} slot(s): started worker(s) {', '.join(started)}"
                              + self._on_hosts(started) + "; they join at the members' next commit")
        if removing:
            self.removing = sorted(removing, key=lambda name: int(name[1:]))
            self.console.note(f"discovery reports {slots} slot(s): worker(s) {', '.join(self.removing)}"
                              + self._on_hosts(self.removing) + " leave at the members' next commit")
        if not started and not removing:
            return
        self.epoch = dataclasses.replace(self.epoch, pending=True)
        write_epoch(self.folder, self.epoch)

    def _workers_on(self, host: str) -> int:
        """Live workers on ``host``, members and waiting, less those already leaving."""
        return sum(1 for name in self.workers if self.host_of[name] == host and name not in self.removing)

    def _on_hosts(self, names: Sequence[str]) -> str:
        hosts = sorted({self.host_of[n] for n in names if not is_local(self.host_of[n])})
        return f" on {', '.join(hosts)}" if hosts else ""

    def _remove_shared_memory(self) -> None:
        for job_id in self.job_ids:
            for name in sweep(job_id):
                self.console.note(f"removed leftover shared memory /dev/shm/{name}")
