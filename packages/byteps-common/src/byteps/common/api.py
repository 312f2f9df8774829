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
import functools
import itertools
import logging
import operator
import os
import threading
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from byteps.common.compression import parse_compression_params
from byteps.common.config import Config
from byteps.common.dtypes import DType
from byteps.common.elastic import membership
from byteps.common.fusion import push_pull_group_async as _push_pull_group_async
from byteps.common.handle import Handle
from byteps.common.logging_setup import configure_logging
from byteps.common.options import PushPullOptions
from byteps.common.row_sparse import SparseRows
from byteps.common.worker import Worker
from byteps.transport import TransportError

__all__ = [
    "init", "shutdown", "suspend", "abandon", "is_initialized", "membership_epoch",
    "rank", "size", "local_rank", "local_size",
    "declare", "push_pull", "push_pull_async", "push_pull_group_async", "poll", "synchronize", "barrier", "worker",
    "sparse_push_pull",
]

_lock = threading.Lock()
_worker: Optional[Worker] = None
_suspended: Optional[Worker] = None  # left by suspend(): still in the job, resumed by init()
_handles: Dict[int, Handle] = {}
_handle_ids = itertools.count(1)
_epoch: Optional[membership.Epoch] = None  # elastic jobs: the membership epoch this process joined last
#: An elastic worker's BYTEPS_RENDEZVOUS_TIMEOUT unless set: how long it waits for an epoch that was ended.
ELASTIC_RENDEZVOUS_TIMEOUT_S = 30
log = logging.getLogger("byteps.common.api")


def _config_from_env() -> Config:
    """The environment's Config; an elastic worker's first waits to be let into the next membership epoch.

    The epoch's variables (ranks, the scheduler's port, the job secret) are
    written into ``os.environ`` as well, where scripts read them as they
    read horovodrun's.
    """
    global _epoch
    board = membership.board_from_env()
    if board is not None:
        worker_name = os.environ[membership.ELASTIC_WORKER].strip()
        after = _epoch.number if _epoch is not None else -1
        epoch = membership.wait_for_epoch(board, worker_name, after)
        os.environ.update(epoch.environment(worker_name))
        # A scheduler that was ended before this worker reached it never answers: give up on it in
        # time to join the next epoch.
        os.environ.setdefault("BYTEPS_RENDEZVOUS_TIMEOUT", str(ELASTIC_RENDEZVOUS_TIMEOUT_S))
        _epoch = epoch
    return Config.from_env()


def _new_worker(config: Config) -> Worker:
    """A Worker in ``config``'s job; an elastic worker whose epoch ended while it joined waits for the next one."""
    while True:
        try:
            if _epoch is None:
                return Worker(config)
            # A dead scheduler cannot say that its epoch is over; the epoch file can.
            watch = functools.partial(membership.epoch_ended, membership.board_from_env(), _epoch.number)
            return Worker(config, job_over=watch)
        except TransportError as exc:
            if _epoch is None:
                raise
            log.warning("could not join membership epoch %d (%s); waiting for the next one", _epoch.number, exc)
            config = _config_from_env()


def membership_epoch() -> Optional[membership.Epoch]:
    """The elastic membership epoch this process joined last; None outside ``bpslaunch --min-np`` jobs."""
    return _epoch


def init(config: Optional[Config] = None) -> None:
    """Join the job described by the environment (or ``config``). Idempotent.

    After :func:`suspend`, the same configuration resumes the suspended
    worker (same rank, same tensors); another one leaves that job first.
    """
    global _worker, _suspended
    with _lock:
        if _worker is not None:
            return
        parked, _suspended = _suspended, None
    if config is None:
        # A suspended worker resumes in its epoch; only a worker with none waits for the next one.
        config = Config.from_env() if parked is not None else _config_from_env()
    with _lock:
        if parked is not None and parked.config == config:
            _worker = parked
            return
    if parked is not None:
        parked.shutdown()
    with _lock:
        if _worker is None:
            configure_logging(config, f"worker {config.rank}")
            _worker = _new_worker(config)


def suspend() -> None:
    """Stop serving this process's calls (as if shut down) but stay in the job, for a later init().

    Horovod lets a process shut down and init again; a byteps worker cannot
    leave its job and join it again, so the frameworks' shutdown() suspends
    it, and it leaves the job at :func:`shutdown` or at exit.
    """
    global _worker, _suspended
    with _lock:
        if _worker is not None:
            _suspended, _worker = _worker, None
        _handles.clear()


def shutdown() -> None:
    """Leave the job; safe to call twice; also runs at interpreter exit."""
    for leaving in _take_workers():
        leaving.shutdown()


def abandon() -> None:
    """Leave a broken job at once, without goodbyes (see Worker.abandon); a later init() joins another."""
    for leaving in _take_workers():
        leaving.abandon()


def _take_workers() -> List[Worker]:
    global _worker, _suspended
    with _lock:
        current, _worker = _worker, None
        parked, _suspended = _suspended, None
        _handles.clear()
    return [w for w in (current, parked) if w is not None]


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


def declare(name: str, nbytes: Optional[int] = None, itemsize: Optional[int] = None) -> int:
    """Give ``name`` the next tensor id (idempotent); returns the id.

    Every worker must declare the same names in the same order. Declaring
    the size too (``nbytes`` of ``itemsize``-byte elements, as its push_pulls
    will send it) lets the worker place the tensor's partitions on the least
    loaded servers (BYTEPS_SERVER_ASSIGNMENT=balanced), since then every
    worker sees the same sizes in the same order; a tensor declared without
    one is placed by hashing its keys. A push_pull of another size under
    this name is then an error.
    """
    if nbytes is None and itemsize is None:
        return worker().declare(name)
    if nbytes is None or itemsize is None:
        raise ValueError(f"declare({name!r}): give both nbytes and itemsize, or neither")
    try:
        size_, item = operator.index(nbytes), operator.index(itemsize)
    except TypeError:
        size_, item = -1, 0
    if size_ < 0 or item < 1 or size_ % item:
        raise ValueError(f"declare({name!r}): nbytes={nbytes!r} must be a whole number of "
                         f"itemsize={itemsize!r}-byte elements")
    return worker().declare(name, nbytes=size_, itemsize=item)


def barrier() -> None:
    worker().barrier()


def push_pull_async(tensor: Any, name: str, average: bool = True, output: Any = None,
                    dtype: Optional[Union[str, DType]] = None, *,
                    compression_params: Optional[Mapping[str, Any]] = None, lr: Optional[float] = None) -> int:
    """Start a push_pull; returns an integer handle for poll()/synchronize().

    ``compression_params`` is BytePS's gradient compression (docs/compression.md; without Nesterov
    momentum, which belongs to an optimizer), ``lr`` the learning rate error feedback rescales by.
    """
    handle = worker().push_pull_async(tensor, name, PushPullOptions(
        average=average, output=output, dtype=dtype, compression=parse_compression_params(compression_params), lr=lr))
    handle_id = next(_handle_ids)
    _handles[handle_id] = handle
    return handle_id


def push_pull_group_async(tensors: Sequence[Any], names: Sequence[str], average: bool = True,
                          outputs: Optional[Sequence[Any]] = None,
                          dtypes: Optional[Sequence[Union[str, DType, None]]] = None,
                          compression_params: Optional[Mapping[str, Any]] = None,
                          lr: Optional[float] = None) -> List[int]:
    """Start push_pulls of many tensors, small ones fused into shared buffers; one handle per tensor.

    Every rank must pass the same names, sizes and dtypes in the same
    order (see :mod:`byteps.common.fusion`); BYTEPS_FUSION_THRESHOLD and
    BYTEPS_FUSION_MAX_TENSOR_BYTES decide the buckets::

        handles = bps.push_pull_group_async(grads, names=[f"g{i}" for i in range(len(grads))])
        results = [bps.synchronize(h) for h in handles]

    ``compression_params`` (BytePS's dict, without Nesterov) and ``lr``:
    the tensors large enough are compressed, each alone, fused apart.
    """
    handles = _push_pull_group_async(worker(), tensors, names, average, outputs, dtypes,
                                     compression=parse_compression_params(compression_params), lr=lr)
    ids = [next(_handle_ids) for _ in handles]
    _handles.update(zip(ids, handles))
    return ids


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


def sparse_push_pull(ids: Any, rows: Any, table: str, num_rows: int, row_shape: Sequence[int],
                     average: bool = False, dtype: Any = None) -> SparseRows:
    """Row-sparse push_pull: every worker's (ids, rows) of ``table`` summed by id (averaged if ``average``);
    returns the union of ids, ascending, and their rows (see Worker.sparse_push_pull, docs/sparse.md).
    ``dtype="bfloat16"`` for bfloat16 rows in 16-bit storage."""
    return worker().sparse_push_pull(ids, rows, table, num_rows, row_shape, average, dtype)


def push_pull(tensor: Any, name: str, average: bool = True, output: Any = None,
              dtype: Optional[Union[str, DType]] = None, *,
              compression_params: Optional[Mapping[str, Any]] = None, lr: Optional[float] = None) -> Any:
    """Sum or average ``tensor`` over all workers (in place unless ``output``); see push_pull_async."""
    return worker().push_pull_async(tensor, name, PushPullOptions(
        average=average, output=output, dtype=dtype, compression=parse_compression_params(compression_params),
        lr=lr)).wait()
