"""A stand-in for a GPU, for CPU tests of byteps' CUDA staging bookkeeping only (docs/gpu.md).

It is not a GPU path and nothing outside tests uses it: a test worker calls
:func:`install` before ``init()``; then a :class:`StandInCudaTensor` (host
memory that reports itself as ``cuda:N`` through ``__dlpack_device__``) goes
through the same DEVICE_TO_HOST / HOST_TO_DEVICE stages, pinned-buffer
reuse and copy waiter as a real CUDA tensor, with copies that run in order
on one thread ("the side stream"), ``delay_s`` each, so partitions really
become ready one by one.

For GPU-side local aggregation (byteps.common.engine.device) its "device
slots" are memfds that the other local processes map through
``/proc/<pid>/fd`` (where CUDA IPC hands them a handle), and its "kernel"
sums with byteps' host kernels on the same thread.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import queue
import threading
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from byteps.common import device_staging, kernels

__all__ = ["HostStandInEngine", "StandInCudaTensor", "install"]


class StandInCudaTensor:
    """Host memory that says it is a CUDA tensor (DLPack device type 2)."""

    def __init__(self, array: np.ndarray, device: int = 0) -> None:
        self.host_array = array
        self.device = device

    def __dlpack_device__(self) -> Tuple[int, int]:
        return 2, self.device


class HostStandInEngine(device_staging.CopyEngine):
    """A stand-in for a GPU in CPU tests of the staging bookkeeping (never chosen outside them).

    "Device memory" is host memory of an object that reports itself as a CUDA
    tensor; the "side stream" is one thread that runs the queued copies in
    order, ``delay_s`` each, so partitions really become ready one by one.
    """

    def __init__(self, device: int, delay_s: float = 0.0) -> None:
        self.device = device
        self.delay_s = delay_s
        self._queue: queue.SimpleQueue[Optional[Callable[[], None]]] = queue.SimpleQueue()
        self.copies_to_host = 0
        self.copies_to_device = 0
        self.pinned_buffers = 0
        self.handed_over: List[Optional[int]] = []
        self.copies_on_device = 0
        self.reductions = 0
        self.shared_slots = 0
        self._regions: List[mmap.mmap] = []  # device slots, this process's and its peers' (live with it)
        threading.Thread(target=self._run, name="byteps-stand-in-stream", daemon=True).start()

    def _run(self) -> None:
        while True:
            work = self._queue.get()
            if work is None:
                return
            work()

    def _queue_event(self) -> threading.Event:
        event = threading.Event()
        self._queue.put(event.set)
        return event

    def pinned(self, nbytes: int) -> np.ndarray:
        self.pinned_buffers += 1
        return np.zeros(nbytes, dtype=np.uint8)

    def device_buffer(self, tensor: Any, what: str) -> Tuple[int, int, Optional[np.dtype], Any]:
        array = tensor.host_array
        if not array.flags.c_contiguous:
            raise ValueError(f"{what}: the CUDA tensor is not contiguous; pass a contiguous copy")
        return array.ctypes.data, array.nbytes, array.dtype, array

    def _copy(self, destination: int, source: int, nbytes: int) -> None:
        if self.delay_s:
            threading.Event().wait(self.delay_s)
        ctypes.memmove(destination, source, nbytes)

    def to_host(self, host: np.ndarray, pointer: int) -> Any:
        self.copies_to_host += 1
        self._queue.put(lambda: self._copy(host.ctypes.data, pointer, host.nbytes))
        return self._queue_event()

    def to_device(self, pointer: int, host: np.ndarray) -> None:
        self.copies_to_device += 1
        self._queue.put(lambda: self._copy(pointer, host.ctypes.data, host.nbytes))

    def copy_device(self, destination: int, source: int, nbytes: int) -> None:
        self.copies_on_device += 1
        self._queue.put(lambda: self._copy(destination, source, nbytes))

    def shared_memory(self, nbytes: int) -> Tuple[int, bytes]:
        fd = os.memfd_create("byteps-stand-in-device-slot")
        os.ftruncate(fd, max(1, nbytes))
        self.shared_slots += 1
        return self._map(fd), json.dumps({"pid": os.getpid(), "fd": fd}).encode()

    def open_shared(self, handle: bytes) -> int:
        fields = json.loads(handle)
        fd = os.open(f"/proc/{fields['pid']}/fd/{fields['fd']}", os.O_RDWR)
        try:
            return self._map(fd)
        finally:
            os.close(fd)

    def _map(self, fd: int) -> int:
        region = mmap.mmap(fd, 0)
        self._regions.append(region)
        return ctypes.addressof(ctypes.c_char.from_buffer(region))

    def reduce(self, destination: int, sources: List[int], nbytes: int, dtype: Any, divisor: int) -> None:
        self.reductions += 1

        def work() -> None:
            total = _bytes_at(destination, nbytes)
            total[:] = _bytes_at(sources[0], nbytes)
            for source in sources[1:]:
                kernels.sum_into(total, _bytes_at(source, nbytes), dtype)
            if divisor > 1:
                kernels.scale_into(total, total, dtype, divisor)
        self._queue.put(work)

    def record(self) -> Any:
        return self._queue_event()

    def wait(self, event: Any) -> None:
        event.wait()

    def done(self, event: Any) -> bool:
        return event.is_set()

    def hand_over(self, event: Any, stream: Optional[int]) -> None:
        self.handed_over.append(stream)
        event.wait()



def _bytes_at(pointer: int, nbytes: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(pointer)) if nbytes else \
        np.zeros(0, np.uint8)


def install(delay_s: float = 0.0) -> List[HostStandInEngine]:
    """Every later worker's CUDA engine is a stand-in; the list collects them (for a test's checks)."""
    made: List[HostStandInEngine] = []

    def factory(device: int) -> HostStandInEngine:
        engine = HostStandInEngine(device, delay_s)
        made.append(engine)
        return engine

    device_staging.use_engine(factory)
    return made
