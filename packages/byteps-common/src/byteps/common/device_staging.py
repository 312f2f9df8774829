"""CUDA tensors on a host route: pinned staging, partition by partition (docs/gpu.md).

byteps sums on CPUs (the servers, the local aggregation's shared memory), so
a CUDA tensor travels through a pinned host buffer. Its route gains two
stages (:mod:`byteps.common.engine.route`): DEVICE_TO_HOST first, HOST_TO_DEVICE
last. Who does what:

* the API thread (``push_pull_async``) reads the tensor through DLPack with
  the engine's side stream as the consumer, so the framework makes the side
  stream wait on its own (producer) stream through an event: no
  device-wide synchronize. It then queues the device-to-host copies on the
  side stream, one per run of consecutive partitions of at least
  COPY_BYTES, each followed by an event;
* the copy waiter thread waits for those events in order (CuPy waits
  without the GIL) and tells the communication thread, which moves those
  partitions on: the first partitions are pushed while later ones are
  still copying;
* the communication thread, at HOST_TO_DEVICE, queues the results'
  host-to-device copies on the side stream, again in runs, and moves on.
  After the task's last partition the consumer stream (the caller's, when
  the adapter names it) waits on an event recorded after those copies, and
  only then does the handle complete; without a consumer stream the host
  waits.

With local peers (several worker processes on the machine), a CUDA tensor
is summed on the GPU instead (:mod:`byteps.common.engine.device`): each
process copies its input into a *device slot*, device memory it shares with
the others through CUDA IPC, and only the partition's root copies the sum to
the host and the result back (BYTEPS_GPU_LOCAL_AGGREGATION, docs/gpu.md).

Pinned buffers are allocated once per tensor name and size and reused;
before a buffer is reused, the previous round's host-to-device copies out
of it are waited for.

The copies go through a :class:`CopyEngine`: :class:`CupyEngine` on a GPU
(CuPy is imported only when a CUDA tensor arrives). The CPU tests of this
bookkeeping install a stand-in for the GPU with :func:`use_engine`
(``byteps.testkit.device_stand_in``); nothing else does.
"""

from __future__ import annotations

import collections
import contextlib
import queue
import threading
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import numpy as np

from byteps.common.buffers import TensorView
from byteps.common.dtypes import DType, dtype_of

__all__ = ["CopyEngine", "CupyEngine", "DeviceStaging", "StagedTensor", "device_of", "use_engine"]

#: DLPack device types (dlpack.h's DLDeviceType).
_DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal", 9: "vpi", 10: "rocm",
                 11: "rocm_host", 13: "cuda_managed", 14: "oneapi", 15: "webgpu", 16: "hexagon", 17: "maia"}
_CPU = 1
_CUDA_TYPES = (2, 13)  # device memory and managed memory: copied with cudaMemcpyAsync

_engine_factory: Optional[Callable[[int], CopyEngine]] = None


def use_engine(factory: Optional[Callable[[int], CopyEngine]]) -> None:
    """Tests only: build every later DeviceStaging's engine with ``factory(device)`` (None: CuPy)."""
    global _engine_factory
    _engine_factory = factory


def device_of(obj: Any, what: str) -> Optional[Tuple[str, int]]:
    """``("cuda", index)`` for a tensor in CUDA memory, None for host memory.

    Anything else (ROCm, Metal, ...) is a ValueError naming the tensor and its device.
    """
    probe = getattr(obj, "__dlpack_device__", None)
    if probe is None or isinstance(obj, np.ndarray):
        return None
    kind, index = (int(v) for v in probe())
    if kind == _CPU:
        return None
    name = _DEVICE_NAMES.get(kind, f"device type {kind}")
    if kind not in _CUDA_TYPES:
        raise ValueError(f"{what}: the tensor is on {name}:{index}; byteps takes CPU and CUDA tensors: "
                         "move it to the CPU or to a CUDA device first")
    return "cuda", index


class CopyEngine:
    """The copies of one device: a side stream, pinned buffers, events (an interface)."""

    device: int

    def pinned(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of pinned (page-locked) host memory as a uint8 array."""
        raise NotImplementedError

    def device_buffer(self, tensor: Any, what: str) -> Tuple[int, int, Optional[np.dtype], Any]:
        """(device pointer, nbytes, numpy dtype or None, keep-alive) of a contiguous device tensor, read
        with the side stream as the consumer (the producer's work is ordered before the copies)."""
        raise NotImplementedError

    def to_host(self, host: np.ndarray, pointer: int) -> Any:
        """Queue ``pointer``'s ``host.nbytes`` bytes into ``host``; returns an event that is done after it."""
        raise NotImplementedError

    def to_device(self, pointer: int, host: np.ndarray) -> None:
        """Queue ``host``'s bytes into device memory at ``pointer``."""
        raise NotImplementedError

    def record(self) -> Any:
        """An event after everything queued so far."""
        raise NotImplementedError

    def wait(self, event: Any) -> None:
        """Block this thread until ``event`` is done."""
        raise NotImplementedError

    def done(self, event: Any) -> bool:
        """Whether ``event`` is done, without waiting."""
        raise NotImplementedError

    def hand_over(self, event: Any, stream: Optional[int]) -> None:
        """Make the consumer ``stream`` (a CUDA stream handle) wait for ``event``; None: wait here."""
        self.wait(event)

    def copy_device(self, destination: int, source: int, nbytes: int) -> None:
        """Queue a device-to-device copy (the single-process push_pull with an output)."""
        raise NotImplementedError

    # --- GPU-side local aggregation (byteps.common.engine.device) --------------------------------
    def shared_memory(self, nbytes: int) -> Tuple[int, bytes]:
        """``nbytes`` of device memory that the other processes of this machine can map: (pointer, handle);
        it lives as long as the process."""
        raise NotImplementedError

    def open_shared(self, handle: bytes) -> int:
        """Another local process's :meth:`shared_memory`, mapped here: its pointer."""
        raise NotImplementedError

    def reduce(self, destination: int, sources: List[int], nbytes: int, dtype: DType, divisor: int) -> None:
        """Queue ``destination = the sum of sources`` (at least one; elements of ``dtype``), then the average
        when ``divisor`` > 1 (floor division for integers, as :func:`byteps.common.kernels.scale_into`)."""
        raise NotImplementedError


#: dtypes that GPU-side local aggregation sums (CuPy has no bfloat16: those go through the host)
DEVICE_SUM_DTYPES = (DType.FLOAT32, DType.FLOAT64, DType.FLOAT16, DType.INT32, DType.INT64)


class CupyEngine(CopyEngine):
    """Copies on a non-blocking CUDA stream of its own, through CuPy."""

    def __init__(self, device: int) -> None:
        try:
            import cupy
        except ImportError:
            raise ImportError(
                "byteps moves CUDA tensors through CuPy, which is not installed: pip install cupy-cuda12x "
                "(CUDA 12) or cupy-cuda13x (CUDA 13); the extras do it: pip install 'byteps-torch[cuda12]'") from None
        self._cupy = cupy
        self._runtime = cupy.cuda.runtime
        self.device = device
        with cupy.cuda.Device(device):
            self._stream = cupy.cuda.Stream(non_blocking=True)
        self._keep: List[Any] = []  # pinned allocations (freed with the engine)
        self._shared: List[int] = []  # device slots shared with the local peers (live as long as the process)

    def _on_device(self) -> Any:
        """This engine's device as the calling thread's current one, for the calls within (no switch when it
        is already: the caller's thread usually runs on it)."""
        if self._runtime.getDevice() == self.device:
            return contextlib.nullcontext()
        return self._cupy.cuda.Device(self.device)

    def pinned(self, nbytes: int) -> np.ndarray:
        memory = self._cupy.cuda.alloc_pinned_memory(max(1, nbytes))
        self._keep.append(memory)
        return np.frombuffer(memory, dtype=np.uint8, count=nbytes)

    def device_buffer(self, tensor: Any, what: str) -> Tuple[int, int, Optional[np.dtype], Any]:
        cupy = self._cupy
        with self._on_device(), self._stream:
            try:
                array = cupy.from_dlpack(tensor)
            except (BufferError, TypeError, ValueError) as exc:
                raise ValueError(f"{what}: CuPy cannot read the CUDA tensor through DLPack ({exc})") from None
        if not array.flags.c_contiguous:
            raise ValueError(f"{what}: the CUDA tensor is not contiguous; pass a contiguous copy")
        return int(array.data.ptr), int(array.nbytes), np.dtype(array.dtype), array

    def to_host(self, host: np.ndarray, pointer: int) -> Any:
        if host.nbytes:
            with self._on_device():
                self._runtime.memcpyAsync(host.ctypes.data, pointer, host.nbytes,
                                          self._runtime.memcpyDeviceToHost, self._stream.ptr)
        return self.record()

    def to_device(self, pointer: int, host: np.ndarray) -> None:
        if host.nbytes:
            with self._on_device():
                self._runtime.memcpyAsync(pointer, host.ctypes.data, host.nbytes,
                                          self._runtime.memcpyHostToDevice, self._stream.ptr)

    def copy_device(self, destination: int, source: int, nbytes: int) -> None:
        if nbytes:
            with self._on_device():
                self._runtime.memcpyAsync(destination, source, nbytes, self._runtime.memcpyDeviceToDevice,
                                          self._stream.ptr)

    def shared_memory(self, nbytes: int) -> Tuple[int, bytes]:
        # cudaMalloc'ed, not CuPy's pool: an IPC handle names a whole allocation
        with self._on_device():
            pointer = int(self._runtime.malloc(max(1, nbytes)))
            self._shared.append(pointer)
            return pointer, bytes(self._runtime.ipcGetMemHandle(pointer))

    def open_shared(self, handle: bytes) -> int:
        with self._on_device():
            return int(self._runtime.ipcOpenMemHandle(handle))

    def _array(self, pointer: int, nbytes: int, dtype: DType) -> Any:
        cupy = self._cupy
        memory = cupy.cuda.UnownedMemory(pointer, nbytes, self, self.device)
        return cupy.ndarray((nbytes // dtype.itemsize,), dtype.storage, cupy.cuda.MemoryPointer(memory, 0))

    def reduce(self, destination: int, sources: List[int], nbytes: int, dtype: DType, divisor: int) -> None:
        if not nbytes:
            return
        cupy = self._cupy
        with self._on_device(), self._stream:
            total = self._array(destination, nbytes, dtype)
            first, *others = (self._array(source, nbytes, dtype) for source in sources)
            if not others:
                cupy.copyto(total, first)
            for index, other in enumerate(others):
                cupy.add(first if index == 0 else total, other, out=total)
            if divisor > 1:
                (cupy.floor_divide if dtype.is_integer else cupy.true_divide)(total, divisor, out=total)

    def record(self) -> Any:
        with self._on_device():
            event = self._cupy.cuda.Event(block=False, disable_timing=True)
            event.record(self._stream)
        return event

    def wait(self, event: Any) -> None:
        event.synchronize()

    def done(self, event: Any) -> bool:
        return bool(event.done)

    def hand_over(self, event: Any, stream: Optional[int]) -> None:
        if stream is None:
            event.synchronize()
            return
        with self._on_device():
            self._runtime.streamWaitEvent(stream, event.ptr, 0)


#: The least bytes one device-to-host or host-to-device copy moves (a run of partitions): each copy costs
#: tens of microseconds of Python and CUDA calls, so one per 512 KB partition of a 100 MB tensor would add
#: milliseconds, while 4 MB keeps the first push no more than ~0.2 ms of PCIe time behind.
COPY_BYTES = 4 << 20


def _runs(partitions: List[Any]) -> List[Tuple[int, int]]:
    """(first, last) partition indices of consecutive runs of at least COPY_BYTES (the last run: the rest)."""
    runs, first, size = [], 0, 0
    for index, part in enumerate(partitions):
        size += part.nbytes
        if size >= COPY_BYTES or index == len(partitions) - 1:
            runs.append((first, index))
            first, size = index + 1, 0
    return runs


class StagedTensor:
    """One push_pull of a CUDA tensor: its host views and where its partitions' copies stand.

    ``ready``/``waiting`` are touched only by the communication thread.
    """

    def __init__(self, staging: DeviceStaging, slot: _Slot, source: TensorView, target: TensorView,
                 input_pointer: int, output_pointer: int, stream: Optional[int], keep: Tuple[Any, ...],
                 shared: Optional[Tuple[int, bytes]] = None) -> None:
        self.staging = staging
        #: GPU-side local aggregation: (pointer, IPC handle) of this process's device slot for the tensor: the
        #: input's copy at ``pointer``, the results of the partitions it roots ``source.nbytes`` after
        self.shared = shared
        self.slot = slot
        self.source = source  # pinned host copy of the input
        self.target = target  # pinned host buffer of the result (``source`` in place)
        self.input_pointer = input_pointer
        self.output_pointer = output_pointer
        self.stream = stream  # the consumer's CUDA stream; None: the handle waits on the host
        self._keep = keep  # the device arrays, alive until done
        self.ready: List[bool] = []  # per partition: its device-to-host copy is done
        self.waiting: Dict[int, Any] = {}  # partition index -> trip parked at DEVICE_TO_HOST
        self.partitions = 0
        self._ends: List[int] = []  # each partition's end offset
        self._back: List[bool] = []  # per partition: reached HOST_TO_DEVICE
        self._back_next = 0  # the first partition (in offset order) not yet at HOST_TO_DEVICE
        self._back_issued = 0  # bytes from the start whose copy back is queued
        self._out_left = 0  # GPU-side local aggregation: partitions not yet copied out

    @property
    def local(self) -> bool:
        """Whether this push_pull's local aggregation runs on the GPU (byteps.common.engine.device)."""
        return self.shared is not None

    def start(self, partitions: List[Any],
              ready: Callable[[StagedTensor, Tuple[int, ...], Optional[BaseException]], None]) -> None:
        """Queue the device-to-host copies, a run of consecutive partitions of at least COPY_BYTES each;
        ``ready(self, indices, error)`` follows, from the copy waiter thread, for partitions whose copies
        are done."""
        self.partitions = len(partitions)
        self.ready = [False] * self.partitions
        self._ends = [part.offset + part.nbytes for part in partitions]  # by index, in offset order
        self._back = [False] * self.partitions
        engine = self.staging.engine
        for first, last in _runs(partitions):
            begin, end = partitions[first].offset, self._ends[last]
            event = engine.to_host(self.source.data[begin:end], self.input_pointer + begin)
            self.staging.waiter.put((event, self, tuple(range(first, last + 1)), ready))

    def start_local(self, partitions: List[Any],
                    ready: Callable[[StagedTensor, Tuple[int, ...], Optional[BaseException]], None]) -> None:
        """GPU-side local aggregation: the whole input into this process's device slot (one copy on the
        device); ``ready(self, every index, error)`` follows from the copy waiter."""
        self.partitions = self._out_left = len(partitions)
        self.ready = [False] * self.partitions
        engine = self.staging.engine
        engine.copy_device(self.shared[0], self.input_pointer, self.source.nbytes)
        self.staging.waiter.put((engine.record(), self, tuple(range(self.partitions)), ready))

    def copy_out(self, part: Any, source: int) -> None:
        """GPU-side local aggregation: partition ``part``'s result (device memory at ``source``, the root's
        slot) into the output; after the last one the copies are handed to the consumer."""
        self.staging.engine.copy_device(self.output_pointer + part.offset, source, part.nbytes)
        self._out_left -= 1
        if not self._out_left:
            self.finish()

    def copy_back(self, index: int) -> None:
        """Partition ``index``'s result is in the pinned buffer; the results go to the device in runs of
        consecutive partitions (at least COPY_BYTES, or what is left). After the last one the copies are
        handed to the consumer, so the task may complete."""
        self._back[index] = True
        while self._back_next < self.partitions and self._back[self._back_next]:
            self._back_next += 1
        done_to = self._ends[self._back_next - 1] if self._back_next else 0
        last = self._back_next == self.partitions
        if done_to - self._back_issued >= COPY_BYTES or last:
            begin, self._back_issued = self._back_issued, done_to
            if done_to > begin:
                self.staging.engine.to_device(self.output_pointer + begin, self.target.data[begin:done_to])
        if last:
            self.finish()

    def finish(self) -> None:
        """Every copy back is queued: the consumer waits for them, the buffers are free after them."""
        engine = self.staging.engine
        event = engine.record()
        self.slot.last_copy = event
        engine.hand_over(event, self.stream)

    def copy_through(self) -> None:
        """A single process's push_pull: the result is the input (copied on the device when out of place)."""
        engine = self.staging.engine
        if self.output_pointer != self.input_pointer:
            engine.copy_device(self.output_pointer, self.input_pointer, self.source.nbytes)
        self.finish()


class _Slot:
    """The pinned buffers of one tensor name, reused round after round."""

    def __init__(self, engine: CopyEngine, nbytes: int, out_of_place: bool) -> None:
        self.nbytes = nbytes
        self.source = engine.pinned(nbytes)
        self.target = engine.pinned(nbytes) if out_of_place else None
        self.last_copy: Any = None  # the previous round's last host-to-device copy (its event)


class DeviceStaging:
    """The CUDA tensors of one worker process: their engine, pinned buffers and copy waiter."""

    def __init__(self) -> None:
        self.engine: Optional[CopyEngine] = None
        self._slots: Dict[str, _Slot] = {}
        self._shared: Dict[str, Tuple[int, bytes]] = {}  # tensor name -> its device slot (GPU-side local sums)
        self._lock = threading.Lock()
        self.waiter: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None

    def stage(self, tensor: Any, output: Any, name: str, what: str, dtype: Optional[Any],
              stream: Optional[int], local: bool = False) -> StagedTensor:
        """The host views of a CUDA ``tensor`` (and ``output``; None: in place) for one push_pull;
        ``local``: summed with the local peers on the GPU where its dtype allows (:attr:`StagedTensor.local`)."""
        _, index = device_of(tensor, f"{what} input")
        if output is not None:
            placed = device_of(output, f"{what} output")
            if placed != ("cuda", index):
                where = "cpu" if placed is None else f"{placed[0]}:{placed[1]}"
                raise ValueError(f"{what}: the input is on cuda:{index} but the output on {where}; "
                                 "pass both on the same device")
        engine = self._engine(index, what)
        pointer, nbytes, found, keep_in = engine.device_buffer(tensor, f"{what} input")
        out_pointer, keep_out = pointer, None
        if output is not None:
            out_pointer, out_nbytes, _, keep_out = engine.device_buffer(output, f"{what} output")
            if out_nbytes != nbytes:
                raise ValueError(f"{what}: output has {out_nbytes} bytes, input has {nbytes}")
        element = dtype_of(dtype if dtype is not None else found)
        if nbytes % element.itemsize:
            raise ValueError(f"{what}: {nbytes} bytes are not a whole number of {element.name.lower()} elements")
        shared = self._shared_slot(name, nbytes, what) if local and element in DEVICE_SUM_DTYPES else None
        # GPU-side local sums pull into the pinned source, whether in place or not
        slot = self._slot(name, nbytes, shared is None and output is not None and out_pointer != pointer)
        source = _view(slot.source, element)
        target = source if slot.target is None else _view(slot.target, element)
        return StagedTensor(self, slot, source, target, pointer, out_pointer, stream, (keep_in, keep_out, tensor),
                            shared)

    def _shared_slot(self, name: str, nbytes: int, what: str) -> Tuple[int, bytes]:
        """A tensor's device slot: its input copy, then the results of the partitions this process roots (two
        regions, so that the next round's input never overwrites a result a peer may still be reading)."""
        shared = self._shared.get(name)
        if shared is None:
            try:
                shared = self.engine.shared_memory(2 * nbytes) + (nbytes,)
            except Exception as exc:  # noqa: BLE001 -- CUDA's error, named with the way out
                raise RuntimeError(f"{what}: cannot share GPU memory with the local peers through CUDA IPC "
                                   f"({exc}); set BYTEPS_GPU_LOCAL_AGGREGATION=0 to sum through host memory") from None
            self._shared[name] = shared
        elif shared[2] != nbytes:
            raise ValueError(f"{what}: {nbytes} bytes, but earlier rounds had {shared[2]}; "
                             "a tensor keeps its size for the whole job")
        return shared[0], shared[1]

    def _engine(self, index: int, what: str) -> CopyEngine:
        with self._lock:
            if self.engine is None:
                factory = _engine_factory or CupyEngine
                self.engine = factory(index)
                self._thread = threading.Thread(target=self._wait_for_copies, name="byteps-copy-waiter",
                                                daemon=True)
                self._thread.start()
            elif self.engine.device != index:
                raise ValueError(f"{what}: the tensor is on cuda:{index}, but this process drives cuda:"
                                 f"{self.engine.device} (one GPU per process, as in BytePS and Horovod); "
                                 f"move it there, or set the device per process (torch.cuda.set_device(local_rank))")
            return self.engine

    def _slot(self, name: str, nbytes: int, out_of_place: bool) -> _Slot:
        slot = self._slots.get(name)
        if slot is None or slot.nbytes != nbytes or (slot.target is None) == out_of_place:
            slot = self._slots[name] = _Slot(self.engine, nbytes, out_of_place)
        elif slot.last_copy is not None:
            self.engine.wait(slot.last_copy)  # the last round's copies out of these buffers
            slot.last_copy = None
        return slot

    def _wait_for_copies(self) -> None:
        """Wait for each copy in order; report its partitions, and those of the same push_pull's later copies
        that are done by then, in one message."""
        held: Deque[Any] = collections.deque()
        while True:
            item = held.popleft() if held else self.waiter.get()
            if item is None:
                return
            event, staged, indices, ready = item
            try:
                self.engine.wait(event)
            except BaseException as exc:  # a CUDA error fails the push_pull, not this thread
                ready(staged, indices, exc)
                continue
            indices = list(indices)
            while True:
                try:
                    following = self.waiter.get_nowait()
                except queue.Empty:
                    break
                if following is None or following[1] is not staged or not self.engine.done(following[0]):
                    held.append(following)
                    break
                indices.extend(following[2])
            ready(staged, tuple(indices), None)

    def close(self) -> None:
        if self._thread is not None:
            self.waiter.put(None)
            self._thread.join(timeout=5.0)


def _view(data: np.ndarray, dtype: DType) -> TensorView:
    return TensorView(array=data.view(dtype.storage), data=data, dtype=dtype)
