"""MXNet's dependency engine joined to byteps-common's worker.

Every push_pull of this package becomes two operations on MXNet's engine
(see ``csrc/engine_op.h``): a *ready* op that runs once the arrays are
ready (earlier writes done) and hands their bytes to us, and an *end* op that
holds the arrays until byteps has written the result. In between, the
submitter thread started here passes the bytes to byteps-common and
completes the op from the push_pull's done-callback. So a push_pull returns
at once, waits for the NDArray's pending writes without blocking Python,
and later MXNet operations see its result in order; a failure is raised by
MXNet from the next read of the result (``wait_to_read``, ``asnumpy``).
Under MXNet's NaiveEngine both ops run inside :meth:`EngineBridge.submit`,
which then waits for the result and raises MXNet's error itself.

Example::

    bridge = EngineBridge()
    bridge.open()
    bridge.submit(reads=[], writes=[x], token=t, priority=0, name="x", what="push_pull('x')",
                  start=lambda arrays, dtype: worker.push_pull_async(arrays[0], "x", PushPullOptions(dtype=dtype)))
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import logging
import threading
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
from mxnet.base import _LIB, check_call

from byteps.common import Handle
from byteps.common.dtypes import DType
from byteps.mxnet import _C

__all__ = ["EngineBridge", "Start", "bind_mxnet"]

log = logging.getLogger("byteps.mxnet.engine")

#: Starts the byteps push_pull of an op: numpy views of its arrays (inputs first) and their dtype -> its handle.
Start = Callable[[List[np.ndarray], DType], Handle]

_C_FUNCTIONS = ("MXNDArrayToDLPack", "MXEnginePushSyncND", "MXGetLastError")


def bind_mxnet() -> None:
    """Hand _C the addresses of the MXNet C functions it calls, from the libmxnet mxnet loaded."""
    missing = [name for name in _C_FUNCTIONS if not hasattr(_LIB, name)]
    if missing:
        raise ImportError(f"byteps.mxnet needs MXNet's C API functions {missing}, which this libmxnet lacks "
                          "(they exist since MXNet 1.6): pip install 'mxnet>=1.6,<2'")
    _C.bind_mxnet(*(ctypes.cast(getattr(_LIB, name), ctypes.c_void_p).value for name in _C_FUNCTIONS))


def _handle_of(array) -> int:
    return int(array.handle.value)


@dataclasses.dataclass
class _Pending:
    """An op on the engine whose arrays are not yet handed to byteps."""

    start: Start
    what: str
    keep: tuple  # the NDArrays: their handles must stay valid until the ready op has run


class EngineBridge:
    """The submitter thread and the ops between their ready op and their byteps push_pull."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: Dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._thread: Optional[threading.Thread] = None

    def open(self) -> None:
        """Accept ops (idempotent)."""
        with self._lock:
            if self._thread is not None:
                return
            _C.open_ready_queue()
            self._thread = threading.Thread(target=self._run, name="byteps-mxnet-submit", daemon=True)
            self._thread.start()

    def close(self, reason: str) -> None:
        """Fail every op not yet handed to byteps with ``reason``; stop the submitter thread.

        Ops already handed over are left to byteps-common's shutdown, which
        fails those still in flight.
        """
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return
        _C.close_ready_queue(reason)  # after this no ready op touches an NDArrayHandle again
        thread.join()
        with self._lock:
            self._pending.clear()

    def submit(self, reads: Sequence, writes: Sequence, token, priority: int, name: str, what: str,
               start: Start) -> None:
        """Queue one push_pull of ``reads`` into ``writes`` (in place if ``reads`` is empty) on MXNet's engine."""
        op_id = next(self._ids)
        with self._lock:
            if self._thread is None:
                raise ValueError(f"{what}: byteps.mxnet is not initialized: call init() first")
            # Registered before the push: a NaiveEngine runs the ready op inside it.
            self._pending[op_id] = _Pending(start, what, (tuple(reads), tuple(writes), token))
        rc = _C.push(op_id, [_handle_of(a) for a in reads], [_handle_of(a) for a in writes], [_handle_of(token)],
                     int(priority), name)
        if rc != 0:
            with self._lock:
                self._pending.pop(op_id, None)
            check_call(rc)  # MXNet's own exception, as from any operator it refuses or (NaiveEngine) runs

    def _run(self) -> None:
        while True:
            op = _C.next_ready()
            if op is None:
                return
            with self._lock:
                pending = self._pending.pop(op.id, None)
            if pending is None or op.done:
                continue
            try:
                self._start(op, pending)
            except BaseException as exc:  # the thread must go on; the op's reader gets the error
                op.finish(f"{pending.what}: {exc}")

    @staticmethod
    def _start(op, pending: _Pending) -> None:
        views = op.views()
        pending.keep = ()
        dtype = DType(views[0][1])
        arrays = [np.frombuffer(view, dtype=DType(code).storage).reshape(shape) for view, code, shape in views]
        handle = pending.start(arrays, dtype)
        what = pending.what

        def finished(done: Handle) -> None:
            op.finish("" if done.error is None else f"{what} failed: {done.error}")

        handle.add_done_callback(finished)
