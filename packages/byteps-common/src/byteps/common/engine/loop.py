"""The worker's communication thread: one poller, one queue, the engine behind them.

One thread owns every endpoint of a worker process: the servers'
connections, the other local ranks' and, after rendezvous, the
scheduler's. Other threads hand it work through a queue and wake it
through a pipe: push_pulls to start, barriers and joins, copies a CUDA
tensor finished, stages that ran on a pool. Each ready connection's
message goes to the :class:`~byteps.common.engine.engine.Engine`.

It also keeps the heartbeat with the scheduler and turns a NODE_FAILED
from it (or its silence, or ``job_over``) into an error for every
push_pull in flight and every later one.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any, List, Optional, Tuple

from byteps.common.engine.device import DeviceCopyDone
from byteps.common.engine.dispatcher import StageDone
from byteps.common.engine.engine import Engine, EngineOptions
from byteps.common.engine.failures import as_job_lost
from byteps.common.engine.join import BarrierRequest, JoinCoordinator, JoinRequest
from byteps.common.engine.sparse_task import SparseTask
from byteps.common.engine.task import PushPullTask
from byteps.common.handle import JobLost
from byteps.transport import Command, Context, NodeFailure, Poller, SchedulerClient, TransportError, command_name
from byteps.transport.rendezvous import BARRIER_WORKERS

__all__ = ["CommLoop"]

log = logging.getLogger("byteps.common.engine.loop")
_JOB_CHECK_S = 1.0  # how often EngineOptions.job_over is asked


class CommLoop(threading.Thread):
    """Background thread that moves one worker's partitions and keeps its heartbeat."""

    def __init__(self, context: Context, servers: List[Tuple[str, int]], options: EngineOptions,
                 scheduler: Optional[SchedulerClient] = None) -> None:
        super().__init__(name="byteps-comm", daemon=True)
        self.options = options
        self.scheduler = scheduler
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._wake_read, self._wake_write = os.pipe()
        # Set while a wake-up byte is in the pipe and the thread has not yet drained the queue: further
        # posts need not write another (each write costs a system call and a thread switch).
        self._wake_pending = False
        self.engine = Engine(context, servers, options, self.post)
        self._barriers: List[BarrierRequest] = []  # sent, waiting for BARRIER_RELEASE
        self.join_state = JoinCoordinator(options.rank, self.engine.local, self.engine.exchange, scheduler,
                                          self._barriers, self.engine.tasks, self.engine.dispatcher)
        self.engine.tasks.idle = self._idle
        self._fatal: Optional[BaseException] = None
        self._stopping = False

    @property
    def connections(self) -> list:
        return self.engine.connections

    # --- called from other threads -------------------------------------------------------
    def post(self, item: Any) -> None:
        """Hand ``item`` to the communication thread (a task, a request, a finished stage or copy)."""
        self._queue.put(item)
        if not self._wake_pending:
            self._wake_pending = True
            os.write(self._wake_write, b"t")

    def submit(self, task: Any) -> None:
        """Hand a PushPullTask or a SparseTask to the thread (or fail it at once if the thread is gone)."""
        if self._fatal is not None or not self.is_alive():
            task.handle.set_error(self._fatal or JobLost("the worker's communication thread is not running"))
            return
        self.post(task)

    def barrier(self, timeout_s: float) -> None:
        """Block until every worker has entered the barrier; raises the job's failure if any."""
        request = self._ask(BarrierRequest())
        if not request.done.wait(timeout_s):
            raise TransportError(f"barrier: the other workers did not arrive within {timeout_s:g} s")
        if request.error is not None:
            raise request.error

    def join_job(self) -> int:
        """hvd.join(): block until every worker joined, serving the others' rounds meanwhile; returns the rank
        whose join completed the barrier (the last to join)."""
        request = self._ask(JoinRequest())
        while not request.done.wait(1.0):  # as long as the others train: a dead node fails it
            pass
        if request.error is not None:
            raise request.error
        return request.last

    def _ask(self, request: BarrierRequest) -> Any:
        if self._fatal is not None or not self.is_alive():
            raise self._fatal or TransportError("the worker's communication thread is not running")
        self.post(request)
        return request

    def set_tracer(self, tracer: Any) -> None:
        """Trace from now on into ``tracer`` (None: stop); the comm thread picks it up at its next event."""
        self.engine.set_tracer(tracer)

    def stop(self, linger_ms: Optional[int] = None) -> None:
        """Ask the thread to finish; in-flight tasks fail if it must cut them off. ``linger_ms`` bounds how
        long unsent messages to the servers are kept trying (0: drop them, for a worker leaving a broken job)."""
        self._queue.put(None)
        os.write(self._wake_write, b"s")
        self.join()
        self.engine.close(linger_ms)
        os.close(self._wake_read)
        os.close(self._wake_write)

    # --- the thread ---------------------------------------------------------------------
    def run(self) -> None:
        engine = self.engine
        poller = Poller()
        poller.register(self._wake_read)
        for connection in engine.connections:
            poller.register(connection)
        scheduler = self.scheduler.connection if self.scheduler else None
        if scheduler is not None:
            poller.register(scheduler)
        inbox = engine.local.inbox if engine.local else None
        if inbox is not None:
            poller.register(inbox)
        try:
            while engine.local is not None and engine.local.channel.has_early:
                engine.receive_from_peers()  # sent by faster local ranks while this one authenticated
            next_check = time.monotonic() + _JOB_CHECK_S
            job_over = self.options.job_over
            while not self._stopping:
                wait_s = self.scheduler.pulse() if self.scheduler else None
                if job_over is not None:
                    now = time.monotonic()
                    if now >= next_check:
                        next_check = now + _JOB_CHECK_S
                        reason = job_over()
                        if reason is not None:
                            raise NodeFailure(reason)
                    wait_s = min(wait_s if wait_s is not None else _JOB_CHECK_S, max(0.0, next_check - now))
                for ready in poller.poll(wait_s):
                    if ready is self._wake_read:
                        os.read(self._wake_read, 4096)
                        self._wake_pending = False  # before draining, so no post goes unseen
                        self._drain_queue()
                    elif ready is scheduler:
                        self._receive_from_scheduler()
                    elif ready is inbox:
                        engine.receive_from_peers()
                        self.join_state.progress()
                    else:
                        engine.receive_from_server(ready)
        except NodeFailure as exc:
            log.error("%s", exc)
            self._fail_all(exc, tell_servers=False)
        except BaseException as exc:  # the thread must never die silently
            log.exception("communication thread failed")
            self._fail_all(exc)
        finally:
            self._fail_all(TransportError("the worker was shut down with this push_pull in flight"))

    def _drain_queue(self) -> None:
        engine = self.engine
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is None:
                self._stopping = True
                return
            kind = item.__class__
            if kind is PushPullTask:
                engine.start(item)
            elif kind is SparseTask:
                engine.start_sparse(item)
            elif kind is StageDone:
                engine.stage_done(item)
            elif kind is DeviceCopyDone:
                engine.copies_arrived(item)
            elif kind is JoinRequest:
                self.join_state.ask(item)
            else:
                self.scheduler.connection.send(Command.BARRIER, self.options.rank, aux=BARRIER_WORKERS)
                self._barriers.append(item)

    def _receive_from_scheduler(self) -> None:
        message = self.scheduler.recv()  # raises NodeFailure when the scheduler reports a dead node
        if message.header.command == Command.BARRIER_ARRIVED:
            self.join_state.arrived()
        elif message.header.command == Command.BARRIER_RELEASE and self._barriers:
            request = self._barriers.pop(0)
            if isinstance(request, JoinRequest):
                self.join_state.released(request, message.header.key)
            else:
                request.done.set()
        elif message.header.command != Command.HEARTBEAT:
            log.error("unexpected %s from the scheduler", command_name(message.header.command))

    def _idle(self) -> None:
        if self._fatal is None:
            self.join_state.progress()

    def _fail_all(self, error: BaseException, tell_servers: bool = True) -> None:
        lost = as_job_lost(error)
        if self._fatal is None:
            self._fatal = lost  # first: a join must not start while the tasks fail
        self.engine.failures.fail_all(lost, tell_servers)
        for barrier in self._barriers:
            barrier.fail(lost)
        self._barriers.clear()
        self.join_state.fail(lost)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, BarrierRequest):
                item.fail(lost)
            elif isinstance(item, (PushPullTask, SparseTask)):
                item.handle.set_error(lost)
