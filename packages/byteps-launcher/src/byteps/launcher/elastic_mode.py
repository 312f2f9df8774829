"""Elastic mode: ``bpslaunch -np 3 --min-np 2 --max-np 4 [--host-discovery-script S] COMMAND``.

Horovod's elastic launcher in its local form: each worker process on this
machine stands for one host of one slot. The job runs as a series of
membership epochs (:mod:`byteps.common.elastic.membership`); each epoch has
a fresh scheduler and servers with a new port, job id and secret, so
nothing an older epoch's process sends is ever summed.

* A worker (or a server, or the scheduler) dies: the epoch ends at once.
  bpslaunch stops its scheduler, which tells every node (the survivors get
  ``JobLost``, Horovod's ``HorovodInternalError``, from the collective in
  flight), and publishes the next epoch with the surviving workers in their
  old order. The survivors roll back to their last commit and go on, as
  long as at least ``--min-np`` are left; else the job fails with the dead
  worker's exit status.
* The discovery script reports more slots (``localhost:3``): bpslaunch
  starts new workers, up to ``--max-np``, and marks the epoch ``pending``.
  At their next ``state.commit()`` the members leave it together
  (``HostsUpdatedInterrupt``); once all have said so, the next epoch
  includes the newcomers, who get the state by ``sync()``.
* The discovery script reports fewer slots: the newest members (never
  fewer than ``--min-np``) leave at the members' next commit, the same way,
  and bpslaunch stops them (SIGTERM) once all have left the epoch.
* The job succeeds when every member has exited 0; workers still waiting
  to join then are stopped. Once a member has finished, the job is ending:
  a failure after that fails it.

Example::

    options = ElasticOptions(np=3, min_np=2, max_np=3)
    outcome = ElasticSupervisor(options, ["python", "train.py"], os.environ, console).run()
"""

from __future__ import annotations

import dataclasses
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Dict, List, Mapping, Optional, Sequence, Set

from byteps.common.config import Config
from byteps.common.elastic.membership import ELASTIC_DIR, ELASTIC_WORKER, Epoch, leaving_members, write_epoch
from byteps.common.shared_segment import sweep
from byteps.launcher.child_process import ChildProcess, describe_exit, exit_status
from byteps.launcher.embedded_mode import LOCALHOST, OWNED_VARIABLES
from byteps.launcher.hosts import is_local, parse_host_lines
from byteps.launcher.job_plan import SERVER_ARGV, JobPlan, ProcessSpec, UsageError, child_environment, job_identity
from byteps.launcher.output import Console
from byteps.launcher.ports import free_port
from byteps.launcher.supervisor import DEFAULT_GRACE_PERIOD, TEARDOWN, Supervisor

__all__ = ["ElasticOptions", "ElasticSupervisor", "discover_slots", "DISCOVERY_INTERVAL_S", "NO_LIMIT"]

#: How often the discovery script runs (Horovod polls its script about once a second too).
DISCOVERY_INTERVAL_S = 1.0
DISCOVERY_TIMEOUT_S = 10.0
#: ``max_np`` of a job with a discovery script and no --max-np: the script alone bounds it.
NO_LIMIT = 1 << 30


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


def discover_slots(script: str, timeout_s: float = DISCOVERY_TIMEOUT_S) -> int:
    """Run the discovery script; the slots it reports on this machine. UsageError naming what is wrong.

    The script prints one host per line, ``host:slots`` or ``host`` (one
    slot), as Horovod's does. In the local form every host must be this
    machine (``localhost``, ``127.0.0.1`` or its name).
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
        return 0
    where = f"--host-discovery-script {script} output"
    hosts = parse_host_lines(result.stdout.splitlines(), where)
    remote = [h.name for h in hosts if not is_local(h.name)]
    if remote:
        raise UsageError(f"{where} names {', '.join(remote)}: elastic jobs run on this machine only for now "
                         "(report localhost:SLOTS); elastic training over ssh hosts is not built yet")
    return sum(h.slots for h in hosts)


class ElasticSupervisor(Supervisor):
    """Runs an elastic job: workers that outlive epochs, and one scheduler and servers per epoch."""

    def __init__(self, options: ElasticOptions, command: Sequence[str], environ: Mapping[str, str],
                 console: Optional[Console] = None, grace_period: float = DEFAULT_GRACE_PERIOD,
                 **supervisor_options) -> None:
        options.check()
        if not command:
            raise UsageError("missing COMMAND: what should each worker process run?")
        super().__init__(JobPlan(mode="elastic", distributed=True, processes=()), grace_period=grace_period,
                         console=console, **supervisor_options)
        self.options = options
        self.command = tuple(command)
        self.base_env = {k: v for k, v in environ.items() if k not in OWNED_VARIABLES}
        self.folder = tempfile.mkdtemp(prefix="bpslaunch-elastic-")  # 0700: the epoch file holds the secret
        self.workers: Dict[str, ChildProcess] = {}  # live workers by their lasting name
        self.waiting: List[str] = []  # started, not yet members of an epoch
        self.removing: List[str] = []  # members discovery no longer has slots for: they leave at the next commit
        self.finished: Set[str] = set()
        self.epoch: Optional[Epoch] = None
        self.services: List[ChildProcess] = []  # the current epoch's scheduler and servers
        self.retired: Dict[int, float] = {}  # pid of an older epoch's service -> when to SIGKILL it
        self.job_ids: Set[str] = set()
        self.resets = 0
        self._next_worker = 0
        self._next_discovery = 0.0
        self._last_discovery_error = ""
        self._check_environment()
        self._initial = self._initial_workers()

    # ------------------------------------------------------------ starting

    def _check_environment(self) -> None:
        """The user's BYTEPS_*/DMLC_* knobs, judged as a worker of a stand-in epoch sees them (ConfigError)."""
        stand_in = Epoch(0, ("w",), 1, self.options.num_server, "0" * 12, "x")
        Config.from_env({**self.base_env, "DMLC_ROLE": "worker", **stand_in.environment("w")})

    def _initial_workers(self) -> int:
        """-np, or fewer if the discovery script reports fewer slots (but at least --min-np: UsageError)."""
        if not self.options.discovery_script:
            return self.options.np
        slots = discover_slots(self.options.discovery_script)
        if slots < self.options.min_np:
            raise UsageError(f"--host-discovery-script {self.options.discovery_script} reports {slots} slot(s), "
                             f"fewer than --min-np {self.options.min_np}")
        return min(self.options.np, slots)

    def _start_all(self) -> None:
        for _ in range(self._initial):
            if self._start_worker() is None:
                return
        self._start_epoch(list(self.waiting), "start")

    def run(self):  # type: ignore[override]
        try:
            return super().run()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _start_worker(self) -> Optional[str]:
        name = f"w{self._next_worker}"
        env = child_environment(self.base_env, {"DMLC_ROLE": "worker", ELASTIC_DIR: self.folder,
                                                ELASTIC_WORKER: name})
        spec = ProcessSpec("worker", self.command, env, rank=self._next_worker)
        self._next_worker += 1
        child = self._spawn(spec)
        if child is None:
            return None
        self.workers[name] = child
        self.waiting.append(name)
        return name

    def _start_epoch(self, members: List[str], why: str) -> None:
        number = 0 if self.epoch is None else self.epoch.number + 1
        identity = job_identity({})
        epoch = Epoch(number=number, members=tuple(members), root_port=free_port(LOCALHOST),
                      num_server=self.options.num_server, job_id=identity["BYTEPS_JOB_ID"],
                      secret=identity["BYTEPS_JOB_SECRET"], root_uri=LOCALHOST)
        self.job_ids.add(epoch.job_id)
        shared = {"DMLC_PS_ROOT_URI": LOCALHOST, "DMLC_PS_ROOT_PORT": str(epoch.root_port),
                  "DMLC_NUM_WORKER": str(len(members)), "DMLC_NUM_SERVER": str(epoch.num_server),
                  "DMLC_INTERFACE": "lo", "DMLC_NODE_HOST": LOCALHOST, **identity}
        self.services = []
        roles = [("scheduler", None)] + [("server", i) for i in range(epoch.num_server)]
        for role, index in roles:
            env = child_environment(self.base_env, {**shared, "DMLC_ROLE": role})
            child = self._spawn(ProcessSpec(role, SERVER_ARGV, env, rank=index))
            if child is None:
                return
            self.services.append(child)
        self.epoch = epoch
        self.waiting = [w for w in self.waiting if w not in members]
        write_epoch(self.folder, epoch)
        self.console.note(f"membership epoch {number} ({why}): {len(members)} worker(s) "
                          f"{', '.join(members)}, scheduler on {LOCALHOST}:{epoch.root_port}")

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
        reason = f"worker {name} {describe_exit(returncode)}"
        if name in self.waiting:
            self.waiting.remove(name)
            self.console.note(f"{reason} before it was let into the job")
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

    def _membership_lost(self, reason: str, code: int) -> None:
        if self.finished:  # the job was ending: no new epoch for it
            self._fail(f"{reason} after worker(s) {', '.join(sorted(self.finished))} had finished", code)
            return
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
            slots = discover_slots(self.options.discovery_script)
        except UsageError as exc:
            if str(exc) != self._last_discovery_error:
                self.console.note(f"{exc}; keeping the current workers")
                self._last_discovery_error = str(exc)
            return
        self._last_discovery_error = ""
        if self.epoch is None or self.epoch.pending:
            return  # one change at a time
        target = max(self.options.min_np, min(slots, self.options.max_np))
        change = target - len(self.workers)
        if change > 0:
            started = [name for name in (self._start_worker() for _ in range(change)) if name]
            if not started:
                return
            self.console.note(f"discovery reports {slots} slot(s): started worker(s) {', '.join(started)}; "
                              "they join at the members' next commit")
        elif change < 0:
            # The newest workers go first, so the oldest (and rank 0) stay.
            self.removing = sorted(self._members_alive(), key=lambda name: int(name[1:]))[change:]
            self.console.note(f"discovery reports {slots} slot(s): worker(s) {', '.join(self.removing)} leave at "
                              "the members' next commit")
        else:
            return
        self.epoch = dataclasses.replace(self.epoch, pending=True)
        write_epoch(self.folder, self.epoch)

    def _remove_shared_memory(self) -> None:
        for job_id in self.job_ids:
            for name in sweep(job_id):
                self.console.note(f"removed leftover shared memory /dev/shm/{name}")

