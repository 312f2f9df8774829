"""The worker's communication thread: pushes partitions, pulls their sums.

One thread owns every server connection of a worker process (ZeroMQ
sockets belong to one thread). API calls hand it :class:`PushPullTask`s
through a queue and wake it through a pipe. For each partition it sends a
PUSH (the partition's bytes, read in place by ZeroMQ) and right behind it a
PULL, so the pushes of later partitions overlap the pulls of earlier ones.
Each PULL_RESPONSE is received straight into the output tensor, averaged
there, and the task's handle completes when its last partition has arrived.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import threading
from typing import Dict, List, Optional, Set, Tuple, Union

import zmq

from byteps.common import kernels
from byteps.common.buffers import TensorView
from byteps.common.handle import Handle
from byteps.common.partition import Partition, PartitionPlan
from byteps.transport import Command, Connection, FrameError, NodeFailure, SchedulerClient, TransportError
from byteps.transport.frames import FLAG_AVERAGE, command_name, json_payload
from byteps.transport.rendezvous import BARRIER_WORKERS

__all__ = ["PushPullTask", "BarrierRequest", "CommLoop"]

log = logging.getLogger("byteps.common.comm_loop")


@dataclasses.dataclass
class PushPullTask:
    """One push_pull of one tensor, on its way through the servers."""

    name: str
    round: int
    source: TensorView
    output: TensorView
    plan: PartitionPlan
    average_over: int  # 0 for a sum, else the number of workers to divide by
    handle: Handle
    remaining: int = 0


@dataclasses.dataclass
class BarrierRequest:
    """A barrier with the other workers, carried out by the comm thread (it owns the scheduler socket)."""

    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    error: Optional[BaseException] = None

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done.set()


class CommLoop(threading.Thread):
    """Background thread that moves one worker's partitions and keeps its heartbeat.

    After rendezvous it also owns the connection to the scheduler: it sends
    the heartbeats, serves barriers, and turns a NODE_FAILED from the
    scheduler (or the scheduler's silence) into an error for every push_pull
    in flight and every later one.
    """

    def __init__(self, context: zmq.Context, servers: List[Tuple[str, int]], rank: int,
                 max_payload_bytes: int, scheduler: Optional[SchedulerClient] = None) -> None:
        super().__init__(name="byteps-comm", daemon=True)
        self.rank = rank
        self.connections = [Connection(context, host, port, max_payload_bytes) for host, port in servers]
        self.scheduler = scheduler
        self._barriers: List[BarrierRequest] = []  # sent, waiting for BARRIER_RELEASE
        self._tasks: queue.SimpleQueue[Union[PushPullTask, BarrierRequest, None]] = queue.SimpleQueue()
        self._wake_read, self._wake_write = os.pipe()
        self._in_flight: Dict[Tuple[int, int], Tuple[PushPullTask, Partition]] = {}
        self._initialized_keys: Set[int] = set()
        self._abandoned: Set[Tuple[int, int]] = set()  # (key, round) of failed tasks still answered
        self._fatal: Optional[BaseException] = None
        self._stopping = False
        # Set while a wake-up byte is in the pipe and the thread has not yet
        # drained the queue: further submits need not write another (each
        # write costs a system call and a thread switch).
        self._wake_pending = False

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
        for connection in self.connections:
            connection.close()
        os.close(self._wake_read)
        os.close(self._wake_write)

    @property
    def bytes_sent(self) -> int:
        return sum(c.counters.bytes_sent for c in self.connections)

    @property
    def bytes_received(self) -> int:
        return sum(c.counters.bytes_received for c in self.connections)

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
                    else:
                        self._receive(by_socket[target])
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
        dtype = int(task.source.dtype)
        for part in task.plan.partitions:
            connection = self.connections[part.server]
            if part.key not in self._initialized_keys:
                description = {
                    "name": task.name, "partition": part.index, "shape": list(task.source.shape),
                    "tensor_nbytes": task.plan.nbytes, "nbytes": part.nbytes, "dtype": dtype,
                }
                connection.send(Command.INIT_KEY, self.rank, part.key, payload=json_payload(description))
                self._initialized_keys.add(part.key)
            self._in_flight[(part.key, task.round)] = (task, part)
            payload = task.source.data[part.offset:part.offset + part.nbytes]
            connection.send(Command.PUSH, self.rank, part.key, task.round, payload=payload, dtype=dtype,
                            flags=FLAG_AVERAGE if task.average_over else 0)
            connection.send(Command.PULL, self.rank, part.key, task.round, dtype=dtype)

    def _destination(self, header):
        """Where a sum is received straight into: the output slice, unless it must be averaged.

        An averaged sum is instead divided while being copied out of
        ZeroMQ's buffer (scale_into): one pass over the bytes, not two.
        """
        if header.command != Command.PULL_RESPONSE:
            return None
        entry = self._in_flight.get((header.key, header.round))
        if entry is None or entry[1].nbytes != header.payload_bytes or entry[0].average_over > 1:
            return None
        task, part = entry
        return task.output.data[part.offset:part.offset + part.nbytes]

    def _receive(self, connection: Connection) -> None:
        try:
            message = connection.recv(self._destination)
        except FrameError as exc:
            raise TransportError(f"malformed message from server {connection.address}: {exc}") from exc
        header = message.header
        if header.command == Command.ERROR and (header.key, header.round) in self._abandoned:
            return  # a further complaint about a push_pull that has already failed
        if header.command == Command.ERROR:
            text = bytes(message.payload.buffer).decode(errors="replace") if message.payload else ""
            self._fail_key(header.key, TransportError(f"server {connection.address}: {text}"))
            return
        if (header.key, header.round) in self._abandoned:
            self._abandoned.discard((header.key, header.round))
            return
        entry = self._in_flight.pop((header.key, header.round), None)
        averaged = entry is not None and entry[0].average_over > 1
        if (header.command != Command.PULL_RESPONSE or entry is None or header.payload_bytes != entry[1].nbytes
                or (message.payload is not None) != averaged):
            raise TransportError(
                f"unexpected {command_name(header.command)} for key {header.key} round {header.round} "
                f"({header.payload_bytes} bytes) from server {connection.address}")
        task, part = entry
        if averaged:
            chunk = task.output.data[part.offset:part.offset + part.nbytes]
            kernels.scale_into(chunk, message.payload.buffer, task.output.dtype, task.average_over)
        task.remaining -= 1
        if task.remaining == 0:
            task.handle.set_done()

    def _fail_key(self, key: int, error: BaseException) -> None:
        failed = {id(task): task for (k, _), (task, _) in self._in_flight.items() if k == key or key == 0}
        if not failed:
            raise error
        for task in failed.values():
            self._fail_task(task, error)

    def _fail_task(self, task: PushPullTask, error: BaseException) -> None:
        for part in task.plan.partitions:
            if self._in_flight.pop((part.key, task.round), None) is not None:
                self._abandoned.add((part.key, task.round))
        task.handle.set_error(error)

    def _fail_all(self, error: BaseException) -> None:
        if self._fatal is None:
            self._fatal = error
        for task, _ in list(self._in_flight.values()):
            self._fail_task(task, error)
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
