"""Module-level worker API in Horovod's style, over one process-wide Worker.

Example (run under ``bpslaunch --workers 2 -- python train.py``)::

    import numpy as np
    import byteps.common as bps

    bps.init()
    grad = np.full(10, bps.rank(), dtype=np.float32)
    bps.push_pull(grad, name="grad")          # averaged in place
    handle = bps.push_pull_async(grad, name="grad", average=False)
    bps.synchronize(handle)
    bps.shutdown()
"""

from __future__ import annotations

import atexit
import itertools
import threading
from typing import Any, Dict, Optional, Union

from byteps.common.config import Config
from byteps.common.dtypes import DType
from byteps.common.handle import Handle
from byteps.common.logging_setup import configure_logging
from byteps.common.worker import Worker

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "declare", "push_pull", "push_pull_async", "poll", "synchronize", "barrier", "worker",
]

_lock = threading.Lock()
_worker: Optional[Worker] = None
_handles: Dict[int, Handle] = {}
_handle_ids = itertools.count(1)


def init(config: Optional[Config] = None) -> None:
    """Join the job described by the environment (or ``config``). Idempotent."""
    global _worker
    with _lock:
        if _worker is not None:
            return
        config = config or Config.from_env()
        configure_logging(config, f"worker {config.rank}")
        _worker = Worker(config)


def shutdown() -> None:
    """Leave the job; safe to call twice; also runs at interpreter exit."""
    global _worker
    with _lock:
        current, _worker = _worker, None
        _handles.clear()
    if current is not None:
        current.shutdown()


atexit.register(shutdown)


def worker() -> Worker:
    """The process-wide Worker; ValueError if init() was not called."""
    current = _worker
    if current is None:
        raise ValueError("byteps is not initialized: call init() first")
    return current


def is_initialized() -> bool:
    return _worker is not None


def rank() -> int:
    return worker().rank


def size() -> int:
    return worker().size


def local_rank() -> int:
    return worker().local_rank


def local_size() -> int:
    return worker().local_size


def declare(name: str) -> int:
    return worker().declare(name)


def barrier() -> None:
    worker().barrier()


def push_pull_async(tensor: Any, name: str, average: bool = True, output: Any = None,
                    dtype: Optional[Union[str, DType]] = None) -> int:
    """Start a push_pull; returns an integer handle for poll()/synchronize()."""
    handle = worker().push_pull_async(tensor, name, average, output, dtype)
    handle_id = next(_handle_ids)
    _handles[handle_id] = handle
    return handle_id


def _handle(handle_id: int) -> Handle:
    try:
        return _handles[handle_id]
    except KeyError:
        raise ValueError(f"unknown push_pull handle {handle_id}") from None


def poll(handle_id: int) -> bool:
    """True when the push_pull behind ``handle_id`` has finished."""
    return _handle(handle_id).poll()


def synchronize(handle_id: int) -> Any:
    """Wait for a push_pull and return its output; the handle is then spent."""
    try:
        return _handle(handle_id).wait()
    finally:
        _handles.pop(handle_id, None)


def push_pull(tensor: Any, name: str, average: bool = True, output: Any = None,
              dtype: Optional[Union[str, DType]] = None) -> Any:
    """Sum or average ``tensor`` over all workers (in place unless ``output``)."""
    return worker().push_pull(tensor, name, average, output, dtype)
