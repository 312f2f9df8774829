"""Integer handles of an adapter's asynchronous ops, and push_pull telemetry.

A handle stands for one byteps-common :class:`~byteps.common.Handle` plus
the step that turns its finished host bytes into what the caller gets
(copy back from a staging buffer, decompress, post-scale). That step runs
in the adapter's ``synchronize()``, on the caller's thread, never on
byteps' communication thread.

Example::

    table = HandleTable()
    handle = table.add(PendingOp(core, finish=lambda: result, release=lambda: None))
    table.synchronize(handle)          # waits, frees the handle, returns finish()
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Tuple

from byteps.common.handle import Handle, all_done

__all__ = ["PendingOp", "HandleTable", "SpeedMeter", "OpTracker"]


@dataclasses.dataclass
class PendingOp:
    """One asynchronous op: its core handle, its finishing step and what frees its name."""

    core: Handle
    finish: Callable[[], Any]
    release: Callable[[], None]  # frees the op's name for the next op


class HandleTable:
    """Thread-safe map from integer handles to pending ops."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ops: Dict[int, PendingOp] = {}
        self._ids = itertools.count(1)

    def add(self, op: PendingOp) -> int:
        with self._lock:
            handle = next(self._ids)
            self._ops[handle] = op
        return handle

    def get(self, handle: int) -> PendingOp:
        with self._lock:
            op = self._ops.get(handle)
        if op is None:
            raise ValueError(f"unknown push_pull handle {handle!r} (already synchronized, or from before shutdown())")
        return op

    def pop(self, handle: int) -> None:
        with self._lock:
            self._ops.pop(handle, None)

    def clear(self) -> None:
        with self._lock:
            self._ops.clear()

    def then(self, handle: int, transform: Callable[[Any], Any]) -> int:
        """A new handle for the same op whose synchronize() returns ``transform(result)``; ``handle`` is spent."""
        op = self.get(handle)
        self.pop(handle)
        return self.add(PendingOp(op.core, lambda: transform(op.finish()), op.release))

    def group(self, handles: List[int]) -> int:
        """One handle for several ops (spent): synchronize() waits for all and returns their results, in order."""
        ops = [self.get(handle) for handle in handles]
        for handle in handles:
            self.pop(handle)

        def release() -> None:
            for op in ops:
                op.release()

        return self.add(PendingOp(all_done([op.core for op in ops]), lambda: [op.finish() for op in ops], release))

    def poll(self, handle: int) -> bool:
        """True once the op behind ``handle`` has finished (synchronize() will not block)."""
        return self.get(handle).core.poll()

    def synchronize(self, handle: int) -> Any:
        """Wait for the op, spend its handle, free its name, and return its finished result."""
        op = self.get(handle)
        try:
            op.core.wait()
        finally:
            self.pop(handle)
            op.release()  # done-callbacks may still be running: free the name for the caller now
        return op.finish()

    def add_done_callback(self, handle: int, callback: Callable[[], None]) -> None:
        """Run ``callback()`` once the op has finished (on byteps' communication thread, or now)."""
        self.get(handle).core.add_done_callback(lambda _core: callback())


class SpeedMeter:
    """Throughput of recently completed push_pulls, as BytePS's get_pushpull_speed reports it.

    Each successful push_pull is recorded as (start, end, tensor bytes). The
    speed is the bytes of the push_pulls that ended within ``window_s`` before
    the latest completion, divided by the time from the earliest start among
    them to that completion: the rate at which tensors were reduced while
    byteps was busy, in MB/s (10**6 bytes per second).
    """

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._lock = threading.Lock()
        self._records: Deque[Tuple[float, float, int]] = collections.deque()

    def record(self, start: float, nbytes: int) -> None:
        end = time.time()
        with self._lock:
            self._records.append((start, end, nbytes))
            while self._records and self._records[0][1] < end - self.window_s:
                self._records.popleft()

    def speed(self) -> Tuple[float, float]:
        """(time of the latest completion in seconds since the epoch, MB/s); (0.0, 0.0) before any."""
        with self._lock:
            records = list(self._records)
        if not records:
            return 0.0, 0.0
        latest = max(end for _, end, _ in records)
        recent = [r for r in records if r[1] >= latest - self.window_s]
        elapsed = latest - min(start for start, _, _ in recent)
        total = sum(nbytes for _, _, nbytes in recent)
        return latest, (total / elapsed / 1e6) if elapsed > 0 else 0.0

    def clear(self) -> None:
        with self._lock:
            self._records.clear()


class OpTracker:
    """An adapter's bookkeeping of asynchronous ops: its handles, its names in flight and its speed meter.

    :meth:`track` ties one started push_pull to all three: the name is
    released and the speed recorded when it finishes, and the returned
    integer handle leads to ``finish()`` in :meth:`HandleTable.synchronize`.
    """

    def __init__(self, names: Any) -> None:
        self.names = names          # a TensorNames
        self.handles = HandleTable()
        self.speed = SpeedMeter()

    def track(self, core: Handle, name: str, token: object, start: float, nbytes: int,
              finish: Callable[[], Any]) -> int:
        """A user's name stays in flight until the handle is synchronized (as the refusal of a second op of
        the name says), not merely until the op finishes: an op that finished before its caller looked would
        otherwise let a second op of the name through on one rank and refuse it on another, leaving the ranks
        a round apart. A default name, which a later unnamed op waits for, and a failed op's name are freed
        when the op ends, so that neither a window of unnamed ops nor a caller that gives up on a failed
        handle waits on a synchronize() that comes later or never. An unnamed op's slot, which decides the
        next unnamed op's name, is freed at synchronize() only: a point of the program's order on every rank
        (:meth:`~byteps.common.frontend.names.TensorNames.free_slot`)."""
        held_until_synchronized = not self.names.is_default(name)

        def release() -> None:  # at synchronize(): the name, and an unnamed op's slot (names.free_slot)
            self.names.release(name, token)
            self.names.free_slot(name, token)

        def finished(handle: Handle) -> None:
            if handle.error is None:
                self.speed.record(start, nbytes)
            if handle.error is not None or not held_until_synchronized:
                self.names.release(name, token)

        core.add_done_callback(finished)
        return self.handles.add(PendingOp(core, finish, release))

    def forget(self) -> None:
        """Drop every handle and name (at shutdown)."""
        self.handles.clear()
        self.names.forget()
