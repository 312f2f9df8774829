"""The stages of a CUDA tensor: staging through pinned memory, and local sums on the GPU.

Staged (docs/gpu.md): the API thread queues each partition's copy into
pinned host memory (:mod:`byteps.common.device_staging`); DEVICE_TO_HOST
waits until the copy waiter reports it done, and HOST_TO_DEVICE queues the
result's copy back.

Summed on the GPU inside the machine ("GPU-side local aggregation"): the
worker processes of one machine share device memory through CUDA IPC, as
BytePS reduces a machine's GPUs with NCCL before it pushes; this also works
when several processes share one GPU. Each process owns one *device slot*
per tensor (:meth:`byteps.common.device_staging.DeviceStaging.stage`
allocates it) in two regions: a copy of its input, and the results of the
partitions it roots. Every partition keeps the root that host-side local
aggregation gives it. The route:

* every rank, DEVICE_COPY_IN: its input is copied into its slot's input
  region (queued by the API thread); once done, a non-root sends
  LOCAL_READY to the root, the first round's carrying the slot's IPC handle;
* the root, LOCAL_REDUCE: once every peer is ready, a GPU kernel sums the
  input regions into its result region (divided by the worker count when no
  server takes part), then the sum goes to pinned host memory: the only
  device-to-host copy of the partition on the machine;
* the root, EXCHANGE as on the host route; then DEVICE_RESULT: the pulled
  sum, averaged on the host, copied into the root's result region;
* LOCAL_BROADCAST as on the host route (the first round's LOCAL_DONE
  carries the root's handle);
* every rank, DEVICE_COPY_OUT: the root's result into its output, on its own
  side stream; after the last partition the copies go to the caller's stream.

So each byte crosses PCIe once per direction per machine, and the CPU sums
nothing. A region is never overwritten while another process reads it: a
rank's next input is copied in after its round is complete, which its
roots' LOCAL_DONEs say came after they read its input; a root sums into its
result region only after every peer's next input is copied in, which its
side stream queued after its copies out of this round.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

from byteps.common import kernels
from byteps.common.engine.route import Placement, Stage
from byteps.common.engine.stage import DONE, WAIT, Failure, GpuEvent, Later, Outcome, TaskFailed
from byteps.common.engine.task import PartitionTrip, PushPullTask

__all__ = ["DeviceCopyDone", "DeviceSlots", "DeviceStages", "summed_on_gpu"]


def summed_on_gpu(task: Any) -> bool:
    """Whether ``task`` aggregates locally on the GPU."""
    return task.device is not None and task.device.local


def placement_of(task: PushPullTask) -> Placement:
    if task.device is None:
        return Placement.HOST
    return Placement.GPU_LOCAL if task.device.local else Placement.STAGED


@dataclasses.dataclass(frozen=True)
class DeviceCopyDone:
    """Partitions of a CUDA tensor reached pinned host memory or the device slot (or a copy failed): from
    the copy waiter, through the engine's queue."""

    task: PushPullTask
    indices: Tuple[int, ...]
    error: Optional[BaseException] = None


class DeviceSlots:
    """The peers' device slots as this process sees them, and the GPU work of a root."""

    def __init__(self, local_rank: int) -> None:
        self.local_rank = local_rank
        self._handles: Dict[Tuple[int, int], bytes] = {}  # (local rank, tensor id) -> its slot's IPC handle
        self._opened: Dict[Tuple[int, int], int] = {}  # (local rank, tensor id) -> its slot mapped here
        # tensor ids summed on the GPU: this process's own and those its peers said so of
        self.gpu_tensors: set = set()

    def learn(self, rank: int, tensor_id: int, handle_hex: str) -> None:
        """A peer's slot for ``tensor_id`` (its IPC handle, from a first round's message)."""
        self._handles.setdefault((rank, tensor_id), bytes.fromhex(handle_hex))
        self.gpu_tensors.add(tensor_id)  # a rank that joined before its own first round learns it here

    def peer_slot(self, engine: Any, rank: int, tensor_id: int) -> int:
        """Where local rank ``rank``'s slot for ``tensor_id`` is mapped in this process (opened once)."""
        entry = (rank, tensor_id)
        pointer = self._opened.get(entry)
        if pointer is None:
            handle = self._handles.get(entry)
            if handle is None:
                raise TaskFailed(RuntimeError(f"local rank {rank} sent no device slot for tensor id {tensor_id}: "
                                              "every local rank must push_pull it as a CUDA tensor"))
            try:
                pointer = self._opened[entry] = engine.open_shared(handle)
            except Exception as exc:  # noqa: BLE001 -- CUDA's error, named with the way out
                raise TaskFailed(RuntimeError(
                    f"cannot map local rank {rank}'s GPU memory through CUDA IPC ({exc}); "
                    "set BYTEPS_GPU_LOCAL_AGGREGATION=0 to sum through host memory")) from None
        return pointer

    def reduce(self, trip: PartitionTrip, peers: Sequence[int]) -> GpuEvent:
        """LOCAL_REDUCE's work (the root, every peer ready): this rank's and the peers' inputs summed into its
        result region on the GPU, then the sum to pinned host memory for the servers (or averaged in place
        with no servers)."""
        task, part, staged = trip.task, trip.part, trip.task.device
        engine = staged.staging.engine
        mine = _result_at(staged.shared[0], trip)
        sources = [staged.shared[0] + part.offset] + [
            self.peer_slot(engine, rank, task.plan.tensor_id) + part.offset for rank in peers]
        pushed = trip.route.servers
        engine.reduce(mine, sources, part.nbytes, task.source.dtype, 0 if pushed else task.average_over)
        if pushed:
            trip.data = trip.source  # the partition's window of the pinned buffer
            return GpuEvent(engine.to_host(trip.source, mine))
        trip.data = mine
        return GpuEvent(engine.record())

    def result_from(self, trip: PartitionTrip, root: int) -> None:
        """LOCAL_DONE from ``root``: the partition's result is in its slot."""
        task = trip.task
        trip.data = _result_at(self.peer_slot(task.device.staging.engine, root, task.plan.tensor_id), trip)


class DeviceStages:
    """The device stages' runners. ``local`` is the machine's LocalGroup (None without local peers): a
    non-root's DEVICE_COPY_IN tells the root through it."""

    def __init__(self, local: Any = None) -> None:
        self._local = local

    def runners(self):
        runners = {Stage.DEVICE_TO_HOST: self.device_to_host, Stage.HOST_TO_DEVICE: self.host_to_device}
        if self._local is not None:
            runners.update({Stage.DEVICE_COPY_IN: self.device_copy_in, Stage.DEVICE_RESULT: self.device_result,
                            Stage.DEVICE_COPY_OUT: self.device_copy_out})
        return runners

    def device_to_host(self, trip: PartitionTrip) -> Outcome:
        """DEVICE_TO_HOST: finished once the partition's copy is (now, or when the waiter says so)."""
        staged, index = trip.task.device, trip.part.index
        if staged.ready[index]:
            return DONE
        staged.waiting[index] = trip
        return WAIT

    def host_to_device(self, trip: PartitionTrip) -> Outcome:
        """HOST_TO_DEVICE: the partition's result queued to the device (after the last, handed to the consumer)."""
        trip.task.device.copy_back(trip.part.index)
        return DONE

    def device_copy_in(self, trip: PartitionTrip) -> Outcome:
        """DEVICE_COPY_IN: finished once this rank's input is in its slot; a non-root tells the root."""
        staged, index = trip.task.device, trip.part.index
        if not staged.ready[index]:
            staged.waiting[index] = trip
            return WAIT
        if not self._local.is_root(trip):
            self._local.send_ready(trip, device_slot=staged.shared[1])
        return DONE

    def device_result(self, trip: PartitionTrip) -> Outcome:
        """DEVICE_RESULT (root): the pulled sum, averaged here, into the root's slot for the others."""
        task, staged = trip.task, trip.task.device
        if task.average_over > 1:
            kernels.scale_into(trip.data, trip.data, task.source.dtype, task.average_over)
        engine = staged.staging.engine
        mine = _result_at(staged.shared[0], trip)
        engine.to_device(mine, trip.data)
        trip.data = mine
        return GpuEvent(engine.record())

    def device_copy_out(self, trip: PartitionTrip) -> Outcome:
        """DEVICE_COPY_OUT: the result (``trip.data``, a device pointer) into the output."""
        trip.task.device.copy_out(trip.part, trip.data)
        return DONE

    def copies_arrived(self, done: DeviceCopyDone) -> List[Any]:
        """Events for the trips whose copies the waiter reported done (their stage runs again and finishes)."""
        task = done.task
        if task.failed:
            return []
        if done.error is not None:
            return [Failure(task, done.error)]
        staged, events = task.device, []
        for index in done.indices:
            staged.ready[index] = True
            trip = staged.waiting.pop(index, None)
            if trip is not None:
                try:
                    rerun = self.device_copy_in if trip.stage is Stage.DEVICE_COPY_IN else self.device_to_host
                    events.append(Later(trip, rerun(trip)))
                except TaskFailed as failed:
                    events.append(Failure(task, failed.error, failed.tell_peers))
        return events


def _result_at(slot: int, trip: PartitionTrip) -> int:
    """Where ``trip``'s partition lies in the result region of the device slot at ``slot`` (after the input's)."""
    return slot + trip.task.plan.nbytes + trip.part.offset
