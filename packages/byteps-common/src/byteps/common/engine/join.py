"""Horovod's ``hvd.join()`` inside the engine: a barrier that serves the others' rounds meanwhile.

A worker that has no more data joins once its own push_pulls are all done
(its last push or LOCAL_READY must come before it says it joined):

* it enters the workers' barrier at the scheduler, asking to hear that its
  arrival was counted (BARRIER_ARRIVED). Only then do its zeros count
  anywhere, so a rank that trained on with this one as zeros arrives after
  it: the rank whose arrival releases the barrier (``last``) is the one
  that joined last in the job's causal order, as in Horovod, where the
  coordinator learns of a join before it counts the rank as zeros;
* with local peers it sends LOCAL_JOINED to them; they count it as zeros
  and it stands in for them where it roots a partition
  (:mod:`byteps.common.engine.local_join`);
* with servers, the *machine* joins once every one of its local ranks has:
  local rank 0 sends JOIN to every server, and the servers count the
  machine's missing pushes as zeros. By then every push of the machine has
  been answered (a rank's LOCAL_JOINED follows its last round, which needs
  its roots' answers), so JOIN never overtakes one;
* the join is done when the barrier is released (every rank joined) and
  every local peer's LOCAL_JOINED is in, so every round started before the
  join is complete here.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, List, Optional

from byteps.transport import Command
from byteps.transport.rendezvous import BARRIER_ASK_ARRIVAL, BARRIER_WORKERS

__all__ = ["BarrierRequest", "JoinRequest", "JoinCoordinator"]


@dataclasses.dataclass
class BarrierRequest:
    """A barrier with the other workers, carried out by the communication thread (it owns the scheduler
    connection)."""

    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    error: Optional[BaseException] = None

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done.set()


@dataclasses.dataclass
class JoinRequest(BarrierRequest):
    """hvd.join() on its way: done when released (``last``: the rank whose arrival released it)."""

    started: bool = False
    arrived: bool = False  # the scheduler counted this rank's arrival: its zeros may count from now on
    announced: bool = False  # LOCAL_JOINED sent to the local peers
    released: bool = False
    last: int = -1


class JoinCoordinator:
    """This worker's join in progress, if any. ``barriers`` is the loop's list of barriers sent and not yet
    released (a join's barrier goes there too)."""

    def __init__(self, rank: int, local: Any, exchange: Any, scheduler: Any, barriers: List[BarrierRequest],
                 tasks: Any, dispatcher: Any) -> None:
        self.rank = rank
        self._dispatcher = dispatcher
        self._local, self._exchange, self._scheduler = local, exchange, scheduler
        self._barriers, self._tasks = barriers, tasks
        self.request: Optional[JoinRequest] = None
        self._machine_joined = False  # local rank 0 told the servers this machine joined

    def ask(self, request: JoinRequest) -> None:
        self.request = request
        self.progress()

    def progress(self) -> None:
        """Enter the barrier once this worker's own tasks are done; once the scheduler counted it, tell the
        local peers, and the servers once the whole machine joined; finish once released and every local
        peer joined."""
        request = self.request
        if request is None:
            return
        if not request.started:
            if len(self._tasks):
                return
            request.started = True
            self._scheduler.connection.send(Command.BARRIER, self.rank, round=BARRIER_ASK_ARRIVAL,
                                            aux=BARRIER_WORKERS)
            self._barriers.append(request)
        if not request.arrived:
            return
        if not request.announced:
            request.announced = True
            if self._local is not None:
                self._dispatcher.handle(self._local.join())
        self._tell_servers()
        if request.released and (self._local is None or self._local.joins.all_joined):
            if self._local is not None:
                self._local.joins.end()
            self.request, self._machine_joined = None, False
            request.done.set()

    def _tell_servers(self) -> None:
        """JOIN to every server once the whole machine joined, from one of its processes (local rank 0)."""
        if self._exchange is None or self._machine_joined:
            return
        if self._local is None or self._local.joins.all_joined:
            self._machine_joined = True
            if self._local is None or self._local.local_rank == 0:
                self._exchange.send_join()

    def arrived(self) -> None:
        """The scheduler counted this rank's arrival at the join's barrier."""
        if self.request is not None:
            self.request.arrived = True
            self.progress()

    def released(self, request: JoinRequest, last: int) -> None:
        request.released, request.last = True, last
        self.progress()

    def fail(self, error: BaseException) -> None:
        if self.request is not None:
            self.request.fail(error)
            self.request = None
