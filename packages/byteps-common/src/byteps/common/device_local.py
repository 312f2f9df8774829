"""Local aggregation on the GPU: a CUDA tensor summed inside the machine before anything crosses PCIe twice.

BytePS reduces a machine's GPUs with NCCL before it pushes. Here the
worker processes of one machine share device memory through CUDA IPC
(docs/gpu.md, "GPU-side local aggregation"), which also works when several
processes share one GPU. Each process owns one *device slot* per tensor
(:meth:`byteps.common.device_staging.DeviceStaging.stage` allocates it,
:class:`~byteps.common.device_staging.CopyEngine` exports it) in two
regions: a copy of its input, and the results of the partitions it roots. Every
partition keeps the root that host-side local aggregation gives it
(:meth:`~byteps.common.local_aggregation.LocalGroup.root_of`). Its route
(:mod:`byteps.common.route`):

* every rank, DEVICE_COPY_IN: its input is copied into its slot's input
  region (one device-to-device copy of the whole tensor, queued by the API
  thread);
  once that copy is done, a non-root sends LOCAL_READY to the root. The
  first round's LOCAL_READY carries the slot's IPC handle;
* the root, LOCAL_REDUCE: once every peer is ready, a GPU kernel sums the
  input regions into its result region (divided by the worker count when
  no server takes part), then the sum is copied into pinned host memory: the only
  device-to-host copy of the partition on this machine;
* the root, PUSH and PULL as on the host route; then DEVICE_RESULT: the
  pulled sum, averaged on the host, copied into the root's result region;
* LOCAL_BROADCAST as on the host route: once the result is in the root's
  slot, LOCAL_DONE (the first round's carries the root's handle);
* every rank, DEVICE_COPY_OUT: the root's result into its output, on its own
  side stream; after the last partition the copies are handed to the
  caller's stream.

So each byte crosses PCIe once per direction per machine, not once per
process, and the CPU sums nothing. A region is never overwritten while
another process reads it: a rank's next input is copied in after its
round is complete, which its roots' LOCAL_DONEs say came after they read
its input; a root sums into its result region only after every peer's
next input is copied in, which its side stream queued after its copies out
of this round. Events end every stage that waits for the GPU: the copy waiter
reports them and the communication thread moves the trip on
(:meth:`CommLoop.device_trip_done`).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Sequence, Tuple

from byteps.common import kernels
from byteps.common.route import PartitionTrip, Stage

__all__ = ["DeviceLocal", "summed_on_gpu"]


def summed_on_gpu(task: Any) -> bool:
    """Whether ``task`` (a PushPullTask) aggregates locally on the GPU."""
    return task.device is not None and task.device.local


class DeviceLocal:
    """This process's side of GPU-side local aggregation: the stage handlers and the peers' slots.

    ``proceed(trip)`` moves a trip on; ``post(trip, event)`` moves it on once the GPU has passed
    ``event`` (from the communication thread); ``send_ready(trip, handle)`` is the local group's
    LOCAL_READY.
    """

    def __init__(self, local_rank: int, proceed: Callable[[PartitionTrip], None],
                 post: Callable[[PartitionTrip, Any], None],
                 send_ready: Callable[[PartitionTrip, bytes], None], root_of: Callable[[Any, Any], int]) -> None:
        self.local_rank = local_rank
        self._proceed, self._post, self._send_ready, self._root_of = proceed, post, send_ready, root_of
        self._handles: Dict[Tuple[int, int], bytes] = {}  # (local rank, tensor id) -> its slot's IPC handle
        self._opened: Dict[Tuple[int, int], int] = {}  # (local rank, tensor id) -> its slot mapped here
        # tensor ids summed on the GPU: this process's own (LocalGroup.prepare) and those its peers said so of
        self.gpu_tensors: set = set()

    # --- what the peers tell ---------------------------------------------------------------
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
                raise RuntimeError(f"local rank {rank} sent no device slot for tensor id {tensor_id}: "
                                   "every local rank must push_pull it as a CUDA tensor")
            try:
                pointer = self._opened[entry] = engine.open_shared(handle)
            except Exception as exc:  # noqa: BLE001 -- CUDA's error, named with the way out
                raise RuntimeError(f"cannot map local rank {rank}'s GPU memory through CUDA IPC ({exc}); "
                                   "set BYTEPS_GPU_LOCAL_AGGREGATION=0 to sum through host memory") from None
        return pointer

    # --- the stages ----------------------------------------------------------------------
    def device_copy_in(self, trip: PartitionTrip) -> None:
        """DEVICE_COPY_IN: on once this rank's input is in its slot; a non-root tells the root."""
        staged, index = trip.task.device, trip.part.index
        if not staged.ready[index]:
            staged.waiting[index] = trip  # the copy waiter's report resumes it
            return
        if self._root_of(trip.task, trip.part) != self.local_rank:
            self._send_ready(trip, staged.shared[1])
        self._proceed(trip)

    def reduce(self, trip: PartitionTrip, peers: Sequence[int]) -> None:
        """LOCAL_REDUCE's work (the root, every peer ready): this rank's and the peers' inputs summed into its
        result region on the GPU, then the sum to pinned host memory for the push (or averaged in place with
        no servers)."""
        task, part, staged = trip.task, trip.part, trip.task.device
        engine = staged.staging.engine
        mine = _result_at(staged.shared[0], trip)
        sources = [staged.shared[0] + part.offset] + [
            self.peer_slot(engine, rank, task.plan.tensor_id) + part.offset for rank in peers]
        pushed = trip.next_stage is Stage.PUSH
        engine.reduce(mine, sources, part.nbytes, task.source.dtype, 0 if pushed else task.average_over)
        if pushed:
            trip.data = trip.source  # the partition's window of the pinned buffer
            self._post(trip, engine.to_host(trip.source, mine))
        else:
            trip.data = mine
            self._post(trip, engine.record())

    def device_result(self, trip: PartitionTrip) -> None:
        """DEVICE_RESULT (root): the pulled sum, averaged here, into the root's slot for the others."""
        task, staged = trip.task, trip.task.device
        if task.average_over > 1:
            kernels.scale_into(trip.data, trip.data, task.source.dtype, task.average_over)
        engine = staged.staging.engine
        mine = _result_at(staged.shared[0], trip)
        engine.to_device(mine, trip.data)
        trip.data = mine
        self._post(trip, engine.record())

    def result_from(self, trip: PartitionTrip, root: int) -> None:
        """LOCAL_DONE from ``root``: the partition's result is in its slot."""
        task = trip.task
        engine = task.device.staging.engine
        trip.data = _result_at(self.peer_slot(engine, root, task.plan.tensor_id), trip)

    def device_copy_out(self, trip: PartitionTrip) -> None:
        """DEVICE_COPY_OUT: the result (``trip.data``, a device pointer) into the output."""
        trip.task.device.copy_out(trip.part, trip.data)
        self._proceed(trip)


def _result_at(slot: int, trip: PartitionTrip) -> int:
    """Where ``trip``'s partition lies in the result region of the device slot at ``slot`` (after the input's)."""
    return slot + trip.task.plan.nbytes + trip.part.offset
