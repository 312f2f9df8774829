"""How a stage finishes: the contract between the dispatcher and the stage owners.

A stage owner (the server exchange, the local group, the device copies,
the codecs, copy-out) offers one runner per stage it owns
(:meth:`StageOwner.runners`). The dispatcher calls ``runner(trip)`` when a
trip reaches that stage, and the runner answers with one of:

* :data:`DONE`: the stage is finished now; the dispatcher moves on at once;
* :data:`WAIT`: the stage waits for a message its owner receives (a
  server's answer, a local peer's message); the owner hands the trip back
  as an event of its ``receive()`` when it comes;
* :class:`GpuEvent`: the stage queued GPU work; it is finished once the GPU
  passes ``event`` (the dispatcher hands it to the copy waiter);
* :class:`OffThread`: the stage's work (a codec) may run off the
  communication thread; the dispatcher runs it on its pool, or at once.

A runner that finds its push_pull cannot go on raises :class:`TaskFailed`.
No runner ever calls the next stage or fails a task itself: the dispatcher
alone moves trips on, and alone drops a failed task's trips.

Owners' ``receive()`` calls return *events*: a :class:`PartitionTrip`
whose current stage is finished, or an object with ``deliver(dispatcher)``
(:class:`Later`, :class:`Failure`, :class:`KeyRefused`, :class:`RoundRefused`).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Protocol, Union

__all__ = ["DONE", "WAIT", "GpuEvent", "OffThread", "Outcome", "TaskFailed", "Failure", "KeyRefused", "Later",
           "RoundRefused", "StageOwner", "NOTHING"]

#: The stage is finished now.
DONE = True
#: The stage waits for a message its owner receives.
WAIT = False
#: What a receive() that moves nothing on returns.
NOTHING: tuple = ()


class GpuEvent:
    """The stage is finished once the GPU passes ``event`` (a CopyEngine event)."""

    __slots__ = ("event",)

    def __init__(self, event: Any) -> None:
        self.event = event


class OffThread:
    """The stage is ``work()``, which may run on the codec pool; finished when it returns."""

    __slots__ = ("work",)

    def __init__(self, work: Callable[[], None]) -> None:
        self.work = work


Outcome = Union[bool, GpuEvent, OffThread]


class TaskFailed(Exception):
    """Raised by a runner: the trip's push_pull fails with ``error``; ``tell_peers``: the machine's other
    ranks wait on it and must be told."""

    def __init__(self, error: BaseException, tell_peers: bool = True) -> None:
        super().__init__(str(error))
        self.error = error
        self.tell_peers = tell_peers


class Later:
    """An event: ``trip``'s current stage, started by a message, finishes as ``outcome`` says."""

    __slots__ = ("trip", "outcome")

    def __init__(self, trip: Any, outcome: Outcome) -> None:
        self.trip, self.outcome = trip, outcome

    def deliver(self, dispatcher: Any) -> None:
        dispatcher.settle(self.trip, self.outcome)


class Failure:
    """An event: ``task`` fails with ``error`` (``tell_peers``: tell this machine's other ranks;
    ``tell_servers``: tell the servers, which fail the round on the other machines)."""

    __slots__ = ("task", "error", "tell_peers", "tell_servers")

    def __init__(self, task: Any, error: BaseException, tell_peers: bool = True, tell_servers: bool = True) -> None:
        self.task, self.error, self.tell_peers, self.tell_servers = task, error, tell_peers, tell_servers

    def deliver(self, dispatcher: Any) -> None:
        dispatcher.failures.fail_task(self.task, self.error, self.tell_peers, self.tell_servers)


class KeyRefused:
    """An event: a server refused ``key`` (0: every key) with ``error``; the tasks that use it fail."""

    __slots__ = ("key", "error")

    def __init__(self, key: int, error: BaseException) -> None:
        self.key, self.error = key, error

    def deliver(self, dispatcher: Any) -> None:
        dispatcher.failures.fail_key(self.key, self.error)


class RoundRefused:
    """An event: this machine cannot take part in round ``round_`` of ``key`` and has no task of it (a joined
    local root that cannot stand in for its peers): ``server``, the key's server, fails the round on the other
    machines with ``error``, as :meth:`Failures.fail_task` has it do for a task that fails here."""

    __slots__ = ("key", "round", "server", "error")

    def __init__(self, key: int, round_: int, server: int, error: BaseException) -> None:
        self.key, self.round, self.server, self.error = key, round_, server, error

    def deliver(self, dispatcher: Any) -> None:
        dispatcher.failures.refuse_round(self.key, self.round, self.server, self.error)


class StageOwner(Protocol):
    """What the dispatcher needs of an owner of stages."""

    def runners(self) -> Dict[Any, Callable[[Any], Outcome]]:
        """Each stage this owner runs, with the bound method that starts it."""
