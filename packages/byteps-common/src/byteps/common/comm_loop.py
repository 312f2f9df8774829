"""The worker's communication thread: local aggregation, then the servers.

One thread owns every socket of a worker process (ZeroMQ sockets belong to
one thread): the servers' connections (:mod:`byteps.common.server_exchange`),
the other local ranks' (:mod:`byteps.common.local_aggregation`) and, after
rendezvous, the scheduler's. API calls hand it :class:`PushPullTask`s
through a queue and wake it through a pipe.

Partitions move through their stages independently: with one process per
machine each goes straight to the servers; with several, each is summed on
the machine by its local root, pushed and pulled by that root, and copied
out by every local rank. A task's handle completes when its last partition
is in the output.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import threading
from typing import Dict, List, Optional, Tuple, Union

import zmq

from byteps.common.buffers import TensorView
from byteps.common.handle import Handle
from byteps.common.local_aggregation import LocalGroup
from byteps.common.partition import Partition, PartitionPlan
from byteps.common.server_exchange import PartitionWork, ServerExchange
from byteps.transport import Command, NodeFailure, SchedulerClient, TransportError
from byteps.transport.frames import command_name
from byteps.transport.rendezvous import BARRIER_WORKERS

__all__ = ["PushPullTask", "BarrierRequest", "CommLoop", "CommOptions"]

log = logging.getLogger("byteps.common.comm_loop")


@dataclasses.dataclass
class PushPullTask:
    """One push_pull of one tensor, on its way through the machine and the servers."""

    name: str
    round: int
    source: TensorView
    output: TensorView
    plan: PartitionPlan
    average_over: int  # 0 for a sum, else the number of workers to divide by
    handle: Handle
    remaining: int = 0  # partitions not yet in the output
    network_partitions: int = 0  # partitions this process pushes


@dataclasses.dataclass
class BarrierRequest:
    """A barrier with the other workers, carried out by the comm thread (it owns the scheduler socket)."""

    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    error: Optional[BaseException] = None

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done.set()


@dataclasses.dataclass(frozen=True)
class CommOptions:
    """What the comm thread needs to know about the job (from Config and the address book)."""

    rank: int
    max_payload_bytes: int
    credit_bytes: int = 0  # 0: unbounded
    pipeline: bool = True
    job_id: str = ""
    machine: int = 0  # DMLC_WORKER_ID
    local_rank: int = 0
    local_size: int = 1


class CommLoop(threading.Thread):
    """Background thread that moves one worker's partitions and keeps its heartbeat.

    After rendezvous it also owns the connection to the scheduler: it sends
    the heartbeats, serves barriers, and turns a NODE_FAILED from the
    scheduler (or the scheduler's silence) into an error for every push_pull
    in flight and every later one.
    """

    def __init__(self, context: zmq.Context, servers: List[Tuple[str, int]], options: CommOptions,
                 scheduler: Optional[SchedulerClient] = None) -> None:
        super().__init__(name="byteps-comm", daemon=True)
        self.options = options
        self.rank = options.rank
        self.exchange: Optional[ServerExchange] = None
        if servers:
            self.exchange = ServerExchange(context, servers, options.rank, options.max_payload_bytes,
                                           options.credit_bytes, options.pipeline, self._fail_key)
        self.local: Optional[LocalGroup] = None
        if options.local_size > 1:
            self.local = LocalGroup(context, options.job_id, options.machine, options.local_rank,
                                    options.local_size, self._reduced, self._partition_done, self._fail_task)
        self.scheduler = scheduler
        self._barriers: List[BarrierRequest] = []  # sent, waiting for BARRIER_RELEASE
        self._tasks: queue.SimpleQueue[Union[PushPullTask, BarrierRequest, None]] = queue.SimpleQueue()
        self._wake_read, self._wake_write = os.pipe()
        self._active: Dict[int, PushPullTask] = {}  # id(task) -> task, started and not finished
        self._fatal: Optional[BaseException] = None
        self._stopping = False
        # Set while a wake-up byte is in the pipe and the thread has not yet
        # drained the queue: further submits need not write another (each
        # write costs a system call and a thread switch).
        self._wake_pending = False

    @property
    def connections(self):
        return self.exchange.connections if self.exchange else []

    # --- called from API threads -------------------------------------------------
    def submit(self, task: PushPullTask) -> None:
        if self._fatal is not None or not self.is_alive():
            task.handle.set_error(self._fatal or TransportError("the worker's communication thread is not running"))
            return
        self._enqueue(task)

    def barrier(self, timeout_s: float) -> None:
        """Block until every worker has entered the barrier; raises the job's failure if any."""
        request = BarrierRequest()
        if self._fatal is not None or not self.is_alive():
            raise self._fatal or TransportError("the worker's communication thread is not running")
        self._enqueue(request)
        if not request.done.wait(timeout_s):
            raise TransportError(f"barrier: the other workers did not arrive within {timeout_s:g} s")
        if request.error is not None:
            raise request.error

    def _enqueue(self, item: Union[PushPullTask, BarrierRequest]) -> None:
        self._tasks.put(item)
        if not self._wake_pending:
            self._wake_pending = True
            os.write(self._wake_write, b"t")

    def stop(self) -> None:
        """Ask the thread to finish; in-flight tasks fail if it must cut them off."""
        self._tasks.put(None)
        os.write(self._wake_write, b"s")
        self.join()
        if self.exchange is not None:
            self.exchange.close()
        if self.local is not None:
            self.local.close()
        os.close(self._wake_read)
        os.close(self._wake_write)

    @property
    def bytes_sent(self) -> int:
        return self.exchange.bytes_sent if self.exchange else 0

    @property
    def bytes_received(self) -> int:
        return self.exchange.bytes_received if self.exchange else 0

    # --- the thread ---------------------------------------------------------------
    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._wake_read, zmq.POLLIN)
        by_socket = {}
        for connection in self.connections:
            poller.register(connection.socket, zmq.POLLIN)
            by_socket[connection.socket] = connection
        scheduler_socket = self.scheduler.connection.socket if self.scheduler else None
        if scheduler_socket is not None:
            poller.register(scheduler_socket, zmq.POLLIN)
        inbox = self.local.inbox if self.local else None
        if inbox is not None:
            poller.register(inbox, zmq.POLLIN)
        try:
            while not self._stopping:
                wait_s = self.scheduler.pulse() if self.scheduler else None
                for target, _ in poller.poll(None if wait_s is None else max(1, int(wait_s * 1000))):
                    if target == self._wake_read:
                        os.read(self._wake_read, 4096)
                        self._wake_pending = False  # before draining, so no submit goes unseen
                        self._start_queued_tasks()
                    elif target is scheduler_socket:
                        self._receive_from_scheduler()
                    elif target is inbox:
                        self.local.receive()
                    else:
                        self.exchange.receive(by_socket[target])
        except NodeFailure as exc:
            log.error("%s", exc)
            self._fail_all(exc)
        except BaseException as exc:  # the thread must never die silently
            log.exception("communication thread failed")
            self._fail_all(exc)
        finally:
            self._fail_all(TransportError("the worker was shut down with this push_pull in flight"))

    def _receive_from_scheduler(self) -> None:
        message = self.scheduler.recv()  # raises NodeFailure when the scheduler reports a dead node
        if message.header.command == Command.BARRIER_RELEASE and self._barriers:
            self._barriers.pop(0).done.set()
        elif message.header.command != Command.HEARTBEAT:
            log.error("unexpected %s from the scheduler", command_name(message.header.command))

    def _start_queued_tasks(self) -> None:
        while True:
            try:
                task = self._tasks.get_nowait()
            except queue.Empty:
                return
            if task is None:
                self._stopping = True
                return
            if isinstance(task, BarrierRequest):
                self.scheduler.connection.send(Command.BARRIER, self.rank, aux=BARRIER_WORKERS)
                self._barriers.append(task)
            else:
                self._start(task)

    def _start(self, task: PushPullTask) -> None:
        task.remaining = len(task.plan.partitions)
        if task.remaining == 0:
            task.handle.set_done()
            return
        self._active[id(task)] = task
        if self.local is not None:
            if self.exchange is not None:
                task.network_partitions = sum(
                    self.local.root_of(task.plan.tensor_id, part) == self.options.local_rank
                    for part in task.plan.partitions)
            self.local.start(task)
            return
        task.network_partitions = task.remaining
        for part in task.plan.partitions:
            window = slice(part.offset, part.offset + part.nbytes)
            self.exchange.submit(PartitionWork(task, part, task.source.data[window], task.output.data[window],
                                               task.average_over, self._pushed_and_pulled))

    # --- stage transitions -----------------------------------------------------------
    def _reduced(self, task: PushPullTask, part: Partition, slot) -> None:
        """Local root: the machine's sum of ``part`` is in ``slot``; the servers sum the machines."""
        if self.exchange is None:
            self.local.finish(task, part)
            return
        self.exchange.submit(PartitionWork(task, part, slot, slot, 1, self._pulled_for_machine))

    def _pulled_for_machine(self, work: PartitionWork) -> None:
        self.local.finish(work.task, work.part)

    def _pushed_and_pulled(self, work: PartitionWork) -> None:
        self._partition_done(work.task, work.part)

    def _partition_done(self, task: PushPullTask, part: Partition) -> None:
        task.remaining -= 1
        if task.remaining == 0:
            self._active.pop(id(task), None)
            task.handle.set_done()

    # --- failures -------------------------------------------------------------------
    def _fail_key(self, key: int, round_: int, error: BaseException) -> None:
        """A server refused ``key``: fail the tasks that use it (all, for key 0)."""
        failed = [t for t in self._active.values()
                  if key == 0 or any(p.key == key for p in t.plan.partitions)]
        if not failed:
            raise error
        for task in failed:
            self._fail_task(task, error, True)

    def _fail_task(self, task: PushPullTask, error: BaseException, tell_peers: bool = True) -> None:
        if self._active.pop(id(task), None) is None:
            return  # finished or failed already
        task.remaining = -1  # nothing more completes it
        if self.exchange is not None:
            self.exchange.abandon(task)
        if self.local is not None:
            self.local.abandon(task)
            if tell_peers:
                self.local.tell_peers(task, error)
        task.handle.set_error(error)

    def _fail_all(self, error: BaseException) -> None:
        if self._fatal is None:
            self._fatal = error
        for task in list(self._active.values()):
            self._fail_task(task, error, False)
        for barrier in self._barriers:
            barrier.fail(error)
        self._barriers.clear()
        while True:
            try:
                task = self._tasks.get_nowait()
            except queue.Empty:
                break
            if isinstance(task, BarrierRequest):
                task.fail(error)
            elif task is not None:
                task.handle.set_error(error)
