"""A partition's route as data: the stages it passes, and one dispatcher that moves it on.

Every partition of a push_pull is a :class:`PartitionTrip` that carries the
list of :class:`Stage`\\ s it must pass, planned once by :func:`plan_route`
from where the partition is summed. A stage's handler does its work and,
now or when the event it waits for arrives (a server's answer, a local
peer's message), calls :meth:`RouteDispatcher.proceed`, which starts the
next stage, as BytePS's ``FinishOrProceed`` does. The partition's bytes
travel in ``trip.data``: each stage reads it and leaves its own output there.

The routes (see docs/architecture.md)::

    one process per machine:   PUSH, PULL, COPY_OUT
    local root of a partition: LOCAL_REDUCE, PUSH, PULL, LOCAL_BROADCAST, COPY_OUT
    compressed (BytePS's compression_params): COMPRESS before PUSH, DECOMPRESS after PULL
    a round skipped (backup workers):  PULL, COPY_OUT
    other local ranks:         COPY_IN, LOCAL_BROADCAST, COPY_OUT
    one worker machine:        LOCAL_REDUCE, LOCAL_BROADCAST, COPY_OUT  (root; no servers)
    a CUDA tensor:             DEVICE_TO_HOST first, HOST_TO_DEVICE last (docs/gpu.md)
    a CUDA tensor summed on the GPU inside the machine (docs/gpu.md, "GPU-side local aggregation"):
      local root:              DEVICE_COPY_IN, LOCAL_REDUCE, PUSH, PULL, DEVICE_RESULT, LOCAL_BROADCAST,
                               DEVICE_COPY_OUT  (no PUSH, PULL, DEVICE_RESULT on one worker machine)
      other local ranks:       DEVICE_COPY_IN, LOCAL_BROADCAST, DEVICE_COPY_OUT

A new stage (as COMPRESS and DECOMPRESS were; a trace span around every stage) is a member of
:class:`Stage`, a place in :func:`plan_route` and a handler registered with
the dispatcher: nothing else moves.
"""

from __future__ import annotations

import enum
import time
from typing import Any, Callable, Dict, Optional, Tuple

from byteps.common.partition import Partition

__all__ = ["Stage", "PartitionTrip", "RouteDispatcher", "plan_route"]


class Stage(enum.Enum):
    """One step of a partition's route."""

    DEVICE_TO_HOST = "device_to_host"  # a CUDA tensor: the partition's copy into pinned host memory is done
    COPY_IN = "copy_in"  # a non-root local rank: input into its shared slot, LOCAL_READY to the root
    LOCAL_REDUCE = "local_reduce"  # the local root: every local rank's input summed into its slot
    COMPRESS = "compress"  # the pushing process: momentum, error feedback, the codec (trip.data becomes the payload)
    PUSH = "push"  # the bytes to the partition's server (done when sent; when acknowledged unpipelined)
    PULL = "pull"  # the round's sum back from the server
    DECOMPRESS = "decompress"  # the server's compressed sum into the partition's dense buffer
    LOCAL_BROADCAST = "local_broadcast"  # root: LOCAL_DONE to the others; the others: wait for it
    COPY_OUT = "copy_out"  # the result into the task's output, divided when averaging
    HOST_TO_DEVICE = "host_to_device"  # a CUDA tensor: the partition's result queued back to the device
    # GPU-side local aggregation (byteps.common.device_local); LOCAL_REDUCE then sums on the GPU
    DEVICE_COPY_IN = "device_copy_in"  # the input is in this rank's device slot; LOCAL_READY to the root
    DEVICE_RESULT = "device_result"  # root: the pulled sum (averaged) into its device slot
    DEVICE_COPY_OUT = "device_copy_out"  # the root's device slot into the output (after the last: handed over)


def plan_route(local_root: Optional[bool], has_servers: bool, compressed: bool = False,
               skipped: bool = False, on_device: bool = False, device_local: bool = False) -> Tuple[Stage, ...]:
    """The stages of one partition; ``local_root`` is None without local aggregation; ``skipped``: a closed
    round this worker did not compute (backup workers), pulled without a push; ``on_device``: a CUDA
    tensor, staged through pinned host memory; ``device_local``: a CUDA tensor whose local aggregation
    runs on the GPU (only with local aggregation, uncompressed and not skipped)."""
    if device_local:
        if local_root is None or compressed or skipped:
            raise ValueError("GPU-side local aggregation needs local peers, no compression and no skipped round")
        if not local_root:
            return (Stage.DEVICE_COPY_IN, Stage.LOCAL_BROADCAST, Stage.DEVICE_COPY_OUT)
        network = (Stage.PUSH, Stage.PULL, Stage.DEVICE_RESULT) if has_servers else ()
        return (Stage.DEVICE_COPY_IN, Stage.LOCAL_REDUCE, *network, Stage.LOCAL_BROADCAST, Stage.DEVICE_COPY_OUT)
    route = _host_route(local_root, has_servers, compressed, skipped)
    if on_device:
        return (Stage.DEVICE_TO_HOST, *route, Stage.HOST_TO_DEVICE)
    return route


def _host_route(local_root: Optional[bool], has_servers: bool, compressed: bool, skipped: bool
                ) -> Tuple[Stage, ...]:
    if skipped:
        return (Stage.PULL, Stage.COPY_OUT)
    network = (Stage.PUSH, Stage.PULL) if has_servers else ()
    if network and compressed:
        network = (Stage.COMPRESS, *network, Stage.DECOMPRESS)
    if local_root is None:
        return (*network, Stage.COPY_OUT)
    if local_root:
        return (Stage.LOCAL_REDUCE, *network, Stage.LOCAL_BROADCAST, Stage.COPY_OUT)
    return (Stage.COPY_IN, Stage.LOCAL_BROADCAST, Stage.COPY_OUT)


class PartitionTrip:
    """One partition of one push_pull on its route.

    A plain class with slots: one is made per partition and round, and its
    fields are read on every message of the hot path.
    """

    __slots__ = ("task", "part", "route", "data", "position", "acked", "landing", "source", "output", "dense",
                 "pull_nbytes", "stage_started", "zeros")

    def __init__(self, task: Any, part: Partition, route: Tuple[Stage, ...]) -> None:
        self.task = task  # the PushPullTask
        self.part = part
        self.route = route
        window = slice(part.offset, part.offset + part.nbytes)
        self.source = task.source.data[window]  # the window of the task's input this partition starts from
        self.output = task.output.data[window]  # the window of the task's output it ends in
        self.data: Any = self.source  # the partition's bytes as they stand (input, local sum, server's sum...)
        self.position = -1  # index of the current stage in ``route``; -1 before the first
        self.acked = False  # the server acknowledged the PUSH (its credit is back)
        self.landing: Any = None  # where PULL receives the sum (None: keep the message)
        self.dense: Any = None  # COMPRESS: the dense buffer DECOMPRESS writes the sum into
        self.pull_nbytes = part.nbytes  # bytes of the server's answer (the compressed size when compressed)
        self.stage_started = 0.0  # when the current stage began (time.time(); kept only while tracing)
        self.zeros = False  # LOCAL_REDUCE found no local rank with bytes here: the machine pushes zeros

    @property
    def stage(self) -> Stage:
        return self.route[self.position]

    @property
    def next_stage(self) -> Optional[Stage]:
        following = self.position + 1
        return self.route[following] if following < len(self.route) else None


Handler = Callable[[PartitionTrip], None]


class RouteDispatcher:
    """Moves trips from stage to stage; ``arrived(trip)`` is called when a trip's route is done.

    With a ``tracer`` (:class:`byteps.common.tracing.Tracer`), every stage of
    a traced round becomes a span, from the moment the dispatcher started it
    to the moment it was told the stage is finished.
    """

    def __init__(self, arrived: Handler, tracer: Any = None) -> None:
        self._handlers: Dict[Stage, Handler] = {}
        self._arrived = arrived
        self._tracer = tracer

    def set_tracer(self, tracer: Any) -> None:
        self._tracer = tracer

    def register(self, stage: Stage, handler: Handler) -> None:
        if stage in self._handlers:
            raise ValueError(f"stage {stage.name} has a handler already")
        self._handlers[stage] = handler

    def proceed(self, trip: PartitionTrip) -> None:
        """``trip``'s current stage is finished (or it has not started): begin the next one.

        A trip whose task has failed goes nowhere: late events of a failed
        push_pull are dropped here, in one place.
        """
        if trip.task.failed:
            return
        if self._tracer is not None and self._tracer.traces(trip.task.round):
            self._trace(trip)
        position = trip.position = trip.position + 1
        if position == len(trip.route):
            self._arrived(trip)
            return
        handler = self._handlers.get(trip.route[position])
        if handler is None:
            raise RuntimeError(f"no handler for stage {trip.stage.name} of {trip.route}")
        handler(trip)

    def resume(self, trip: PartitionTrip) -> None:
        """Run ``trip``'s current stage again: its handler parked it until an event that has now come."""
        if not trip.task.failed:
            self._handlers[trip.stage](trip)

    def _trace(self, trip: PartitionTrip) -> None:
        now = time.time()
        if trip.position >= 0:
            task, part = trip.task, trip.part
            self._tracer.span(trip.stage.value, task.name, trip.stage_started, now, key=part.key,
                              partition=part.index, step=task.round + 1)
        trip.stage_started = now
