"""Running a :class:`JobPlan` to completion, and tearing it all down on the first failure.

One thread, one ``select`` loop: children's output pipes, a wakeup socket
for signals (SIGINT, SIGTERM, SIGHUP, and SIGCHLD so that exits are noticed
at once) and timers for the grace periods. Keeping everything on the main
thread matters: the parent-death signal fires when the *thread* that forked
a child exits, and ``preexec_fn`` is only safe when no other thread exists.

The rules (BytePS #429 "join workers as they exit", and more):

* children are joined as they exit, in whatever order; the first non-zero
  exit or death by signal ends the job: SIGTERM to every process group, a
  grace period, then SIGKILL; the job's exit status is the child's code
  (128 + N for signal N);
* when every worker exits 0, the scheduler and servers have a grace period
  to exit on their own; any still running are terminated and reported, and
  the job still succeeds;
* SIGINT/SIGTERM/SIGHUP to bpslaunch tear the job down the same way (exit
  128 + N); a second one skips the grace period;
* at the end, processes the children left behind (their process groups,
  adopted orphans) are terminated too.

Example::

    outcome = Supervisor(plan, grace_period=5.0).run()
    sys.exit(outcome.exit_code)
"""

from __future__ import annotations

import dataclasses
import os
import selectors
import signal
import socket
import time
from typing import Callable, List, Optional

from byteps.common.shared_segment import sweep
from byteps.launcher.child_process import ChildProcess, describe_exit, exit_status
from byteps.launcher.job_plan import JobPlan, ProcessSpec
from byteps.launcher.output import Console, OutputRelay
from byteps.launcher.process_tree import ProcessTree

__all__ = ["Supervisor", "JobOutcome", "DEFAULT_GRACE_PERIOD"]

DEFAULT_GRACE_PERIOD = 5.0
KILL_WAIT = 2.0  # after SIGKILL: how long to wait before reporting a process as unkillable
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

RUNNING, DRAINING, TEARDOWN = "running", "draining", "teardown"


@dataclasses.dataclass(frozen=True)
class JobOutcome:
    """How a job ended: bpslaunch's exit status and, on failure, why."""

    exit_code: int
    reason: str = ""
    interrupted: bool = False  # ended by a signal to bpslaunch (Ctrl-C, SIGTERM), not by a failing process

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def _names(children: List[ChildProcess]) -> str:
    return ", ".join(c.spec.label for c in children)


class Supervisor:
    """Starts every process of a plan, relays its output, and enforces the rules above.

    ``handle_signals`` (main thread only) installs the SIGINT/SIGTERM/SIGHUP/
    SIGCHLD handlers; ``adopt_orphans`` makes this process a child subreaper
    that reaps *every* child it does not track, so leave it off when
    embedding the supervisor in a program with other children.
    """

    def __init__(
        self,
        plan: JobPlan,
        *,
        grace_period: float = DEFAULT_GRACE_PERIOD,
        console: Optional[Console] = None,
        handle_signals: bool = True,
        adopt_orphans: bool = True,
        use_group_reaper: bool = True,
    ) -> None:
        if grace_period < 0:
            raise ValueError(f"grace_period must be >= 0, got {grace_period}")
        self.plan = plan
        self.grace_period = grace_period
        self.console = console or Console()
        self._handle_signals_flag = handle_signals
        self._tree = ProcessTree(adopt_orphans=adopt_orphans, use_group_reaper=use_group_reaper)
        self._selector = selectors.DefaultSelector()
        self._relay = OutputRelay(self._selector)
        self._pending_signals: List[int] = []
        self._phase = RUNNING
        self._deadline: Optional[float] = None
        self._killed = False
        self._exit_code: Optional[int] = None
        self._reason = ""
        self._interrupted = False

    # ------------------------------------------------------------------ run

    def run(self) -> JobOutcome:
        """Run the job to the end; returns its outcome (never leaves a process behind)."""
        self._tree.start()
        restore_signals = None
        try:
            if self._handle_signals_flag:
                restore_signals = self._install_signal_handlers()
            self._start_all()
            while not self._step():
                pass
        finally:
            try:
                if not self._tree.is_empty():  # only after an error of our own
                    self._kill_everything_now()
                self._relay.close()
            finally:
                self._tree.close()
                if restore_signals is not None:
                    restore_signals()
                self._selector.close()
                self._remove_shared_memory()
        return JobOutcome(exit_code=self._exit_code or 0, reason=self._reason, interrupted=self._interrupted)

    def _remove_shared_memory(self) -> None:
        """Remove the shared-memory names a killed worker may have left (every process is gone now)."""
        job_ids = {p.env.get("BYTEPS_JOB_ID", "").strip() for p in self.plan.processes} - {""}
        for job_id in job_ids:
            for name in sweep(job_id):
                self.console.note(f"removed leftover shared memory /dev/shm/{name}")

    def _start_all(self) -> None:
        inherit_stdin = len(self.plan.processes) == 1
        for spec in self.plan.processes:
            self._handle_signals()
            if self._phase == TEARDOWN or self._spawn(spec, inherit_stdin) is None:
                return

    def _spawn(self, spec: ProcessSpec, inherit_stdin: bool = False) -> Optional[ChildProcess]:
        """Start one child and relay its output; None (and the job failing) if it cannot be started."""
        try:
            child = ChildProcess.spawn(spec, inherit_stdin=inherit_stdin, ssh=self.plan.ssh)
        except OSError as exc:
            # the shell's conventions: 127 not found, 126 not executable
            code = 127 if isinstance(exc, FileNotFoundError) else 126 if isinstance(exc, PermissionError) else 1
            self._fail(f"{spec.label} could not be started: {exc}", code)
            return None
        self._tree.add(child)
        streams = ((child.proc.stdout, self.console.stdout), (child.proc.stderr, self.console.stderr))
        for stream, sink in streams:
            fd = os.dup(stream.fileno())  # the relay owns this copy; Popen's is closed now
            stream.close()
            self._relay.attach(fd, spec.prefix, sink)
        child.proc.stdout = child.proc.stderr = None
        return child

    def _step(self) -> bool:
        """One turn of the loop; True when the job is over."""
        for key, _ in self._selector.select(self._timeout()):
            key.data()
        self._handle_signals()
        for child in self._tree.reap():
            self._on_exit(child)
        if self._phase != TEARDOWN:
            self._check_progress()
        return self._phase == TEARDOWN and self._teardown_step()

    def _timeout(self) -> float:
        tick = 0.5 if self._handle_signals_flag else 0.1  # SIGCHLD wakes us when handled
        if self._phase == TEARDOWN:
            tick = 0.05
        if self._deadline is not None:
            tick = min(tick, max(0.0, self._deadline - time.monotonic()))
        return tick

    # --------------------------------------------------------------- events

    def _on_exit(self, child: ChildProcess) -> None:
        returncode = child.returncode
        if self._phase == TEARDOWN or returncode == 0:
            return
        if child.spec.is_worker or self._phase == RUNNING:
            self._fail(f"{child.spec.label} {describe_exit(returncode)}", exit_status(returncode) or 1)
        else:  # a server failing while shutting down after every worker succeeded
            self.console.note(
                f"{child.spec.label} {describe_exit(returncode)} after all workers had finished"
            )

    def _check_progress(self) -> None:
        if not self.plan.workers:  # role mode server/scheduler: it decides when it is done
            if not self._tree.running():
                self._begin_teardown(None)
            return
        workers = [c for c in self._tree.children.values() if c.spec.is_worker]
        if len(workers) < len(self.plan.workers) or any(c.running for c in workers):
            return
        services = self._tree.running()  # only the scheduler and servers are left
        if not services:
            self._begin_teardown(None)  # sweep up whatever the children left behind
        elif self._phase == RUNNING:
            self._phase = DRAINING
            self._deadline = time.monotonic() + self.grace_period
        elif time.monotonic() >= self._deadline:
            self._begin_teardown(
                f"{_names(services)} still running {self.grace_period:g} s after all workers "
                "finished; terminating"
            )

    def _fail(self, reason: str, exit_code: int) -> None:
        if self._exit_code is None:
            self._exit_code, self._reason = exit_code, reason
        if self._phase != TEARDOWN:
            others = self._tree.running()
            if others:
                reason = (
                    f"{reason}; terminating {len(others)} other process(es) "
                    f"(grace period {self.grace_period:g} s)"
                )
            self._begin_teardown(reason)

    def _begin_teardown(self, note: Optional[str]) -> None:
        self._phase = TEARDOWN
        if note:
            self.console.note(note)
        for child in self._tree.live_groups():
            if not child.running:
                self.console.note(f"{child.spec.label} exited but left processes running; terminating them")
        self._tree.signal_all(signal.SIGTERM)
        self._deadline = time.monotonic() + self.grace_period
        self._killed = False

    def _teardown_step(self) -> bool:
        if self._tree.is_empty():
            return True
        now = time.monotonic()
        if not self._killed and now >= self._deadline:
            running = self._tree.running()
            if running:
                self.console.note(
                    f"{_names(running)} still running {self.grace_period:g} s after SIGTERM; sending SIGKILL"
                )
            self._tree.signal_all(signal.SIGKILL)
            self._killed, self._deadline = True, now + KILL_WAIT
        elif not self._killed:
            self._tree.signal_new_orphans(signal.SIGTERM)
        elif now >= self._deadline:
            survivors = [str(c.pid) for c in self._tree.running()] + [str(p) for p in self._tree.orphans()]
            what = ", ".join(survivors) or "(members of the job's process groups)"
            self.console.note(f"could not kill process(es) {what}; giving up")
            return True
        else:
            self._tree.signal_all(signal.SIGKILL)  # orphans adopted since the last sweep
        return False

    def _kill_everything_now(self) -> None:
        deadline = time.monotonic() + KILL_WAIT
        while not self._tree.is_empty() and time.monotonic() < deadline:
            self._tree.signal_all(signal.SIGKILL)
            time.sleep(0.02)

    # -------------------------------------------------------------- signals

    def _install_signal_handlers(self) -> Callable[[], None]:
        wakeup_read, wakeup_write = socket.socketpair()
        wakeup_read.setblocking(False)
        wakeup_write.setblocking(False)

        def record(signum: int, frame: object) -> None:
            self._pending_signals.append(signum)

        def drain() -> None:
            try:
                while wakeup_read.recv(4096):
                    pass
            except (BlockingIOError, InterruptedError):
                pass

        previous_wakeup = signal.set_wakeup_fd(wakeup_write.fileno(), warn_on_full_buffer=False)
        previous = {sig: signal.signal(sig, record) for sig in HANDLED_SIGNALS}
        previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        self._selector.register(wakeup_read, selectors.EVENT_READ, drain)

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            signal.set_wakeup_fd(previous_wakeup)
            wakeup_read.close()
            wakeup_write.close()

        return restore

    def _handle_signals(self) -> None:
        while self._pending_signals:
            signum = self._pending_signals.pop(0)
            name = signal.Signals(signum).name
            if self._exit_code is None:
                self._exit_code, self._reason = 128 + signum, f"received {name}"
                self._interrupted = True
            if self._phase != TEARDOWN:
                self._begin_teardown(
                    f"received {name}; terminating the job (grace period {self.grace_period:g} s)"
                )
            elif not self._killed:
                self.console.note(f"received {name} while terminating; killing the job now")
                self._deadline = time.monotonic()
