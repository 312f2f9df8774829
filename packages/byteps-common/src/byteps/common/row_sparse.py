"""Row-sparse gradients: a table's rows by id, how they are checked, summed, placed and put on the wire.

A row-sparse gradient of a table of ``num_rows`` rows of shape
``row_shape`` is a pair (ids, rows): int64 row ids and an array of shape
``(len(ids), *row_shape)``. Workers and servers share everything here, so
both sides place, encode and sum rows alike (docs/sparse.md):

- :class:`SparseTable`: a table as a worker uses it (its name, id, rows,
  row shape, dtype) and the check of one call's input against it;
- :func:`sum_by_id`: ids sorted and made unique, rows of one id summed
  (float16 and bfloat16 in float32, rounded once);
- :func:`sparse_dtype`: the dtype of a call's rows (bfloat16 given as
  ``dtype="bfloat16"`` over 16-bit storage, or ml_dtypes' ``bfloat16``);
- :func:`server_of`: which server holds a row (a multiplicative hash of
  the id, the same on every worker and in every round);
- :func:`encode` / :func:`decode`: the payload of a sparse PUSH and of its
  answer, ``n`` int64 ids then the ``n`` rows, little-endian.

Example::

    table = SparseTable("emb", 0, num_rows=1000, row_shape=(16,), dtype=DType.FLOAT32)
    ids, rows = table.check(np.array([3, 7, 3]), np.ones((3, 16), np.float32))
    ids, rows = sum_by_id(ids, rows)                    # [3, 7], rows of 3 summed
    payload = encode(ids, rows)                         # what a PUSH carries
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from byteps.common.dtypes import DType, dtype_of
from byteps.common.kernels import accumulate, finalize
from byteps.common.tensor_description import SPARSE_DTYPES
from byteps.common.tensor_registry import SET_ID_SHIFT, SPARSE_TABLE_SET

__all__ = ["SPARSE_DTYPES", "SparseRows", "SparseTable", "decode", "encode", "encode_chunks", "record_nbytes",
           "is_sparse_key", "narrow", "server_of", "sparse_dtype", "sparse_key", "sum_by_id", "table_layout",
           "table_of_key", "widen"]

#: Bits of a key below its tensor id (``tensor_id << 16 | partition``).
_KEY_SHIFT = 16
_HALVES = (DType.FLOAT16, DType.BFLOAT16)  # summed and divided in float32, rounded once
_ID = np.dtype("<i8")
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio: neighbouring ids land on different servers


def sparse_key(table_id: int, server: int) -> int:
    """The key of ``table_id``'s rows held by ``server``: a tensor id of a set of its own
    (:data:`~byteps.common.tensor_registry.SPARSE_TABLE_SET`, which no tensor has), so a table's keys never
    meet a tensor's, and a table and a tensor may share a name."""
    if not 0 <= table_id < 1 << SET_ID_SHIFT or not 0 <= server < 1 << _KEY_SHIFT:
        raise ValueError(f"table {table_id} on server {server}: too many tables or servers")
    return (SPARSE_TABLE_SET << SET_ID_SHIFT | table_id) << _KEY_SHIFT | server


def table_of_key(key: int) -> int:
    """The table id of a row-sparse key (:func:`sparse_key`'s inverse, the server aside)."""
    return key >> _KEY_SHIFT & ((1 << SET_ID_SHIFT) - 1)


def is_sparse_key(key: int) -> bool:
    """Whether ``key`` is a row-sparse table's (:func:`sparse_key`)."""
    return key >> (SET_ID_SHIFT + _KEY_SHIFT) == SPARSE_TABLE_SET


def server_of(ids: np.ndarray, num_servers: int) -> np.ndarray:
    """The server of each row id: the high bits of a multiplicative (Fibonacci) hash of the id, modulo the
    servers. Hot rows of a power law (small ids) and contiguous ranges spread evenly; stable across rounds."""
    if num_servers == 1:
        return np.zeros(len(ids), dtype=np.int64)
    hashed = ids.astype(np.uint64) * _GOLDEN  # wraps modulo 2**64, as meant
    return ((hashed >> np.uint64(32)) % np.uint64(num_servers)).astype(np.int64)


def record_nbytes(row_shape: Sequence[int], dtype: DType) -> int:
    """Bytes of one id and its row on the wire."""
    return _ID.itemsize + int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize


def encode(ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """One payload: the ids (int64, little-endian), then the rows (C order); None-free, possibly empty."""
    count = len(ids)
    payload = np.empty(count * _ID.itemsize + rows.nbytes, dtype=np.uint8)
    payload[:count * _ID.itemsize].view(_ID)[:] = ids
    payload[count * _ID.itemsize:].view(rows.dtype)[:] = rows.reshape(-1)
    return payload


def encode_chunks(ids: np.ndarray, rows: np.ndarray, limit: int, what: str) -> List[Optional[np.ndarray]]:
    """The records cut into payloads of at most ``limit`` bytes each (whole records, in order; at least one,
    None for no records): what a row-sparse push or answer sends, one message per payload. ValueError naming
    ``what`` if one record alone is larger than ``limit``."""
    count = len(ids)
    if count == 0:
        return [None]
    record = _ID.itemsize + rows[0].nbytes
    per_chunk = limit // record if limit else count
    if per_chunk < 1:
        raise ValueError(f"{what}: one (id, row) record is {record} bytes, more than one message carries "
                         f"({limit} bytes, BYTEPS_PARTITION_BYTES)")
    return [encode(ids[start:start + per_chunk], rows[start:start + per_chunk])
            for start in range(0, count, per_chunk)]


def decode(payload: Any, row_shape: Sequence[int], dtype: DType) -> Tuple[np.ndarray, np.ndarray]:
    """(ids, rows) of a payload (views of it, no copy); ValueError for a size no whole number of rows makes."""
    data = np.frombuffer(payload, dtype=np.uint8) if payload is not None else np.empty(0, np.uint8)
    record = record_nbytes(row_shape, dtype)
    if data.nbytes % record:
        raise ValueError(f"a row-sparse payload of {data.nbytes} bytes is not a whole number of "
                         f"{record}-byte (id, row) records")
    count = data.nbytes // record
    ids = data[:count * _ID.itemsize].view(_ID)
    rows = data[count * _ID.itemsize:].view(dtype.storage).reshape((count, *row_shape))
    return ids, rows


def sum_by_id(ids: np.ndarray, rows: np.ndarray, dtype: Optional[DType] = None) -> Tuple[np.ndarray, np.ndarray]:
    """The unique ids, ascending, and the rows of each id summed, in the rows' dtype (``dtype``, else
    ``rows``' own; float16 and bfloat16, stored as uint16, are summed in float32 and rounded once). The sum
    of one id's rows runs in the order the rows come."""
    if len(ids) == 0:
        return ids.astype(np.int64), rows
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    starts = np.flatnonzero(np.concatenate(([True], sorted_ids[1:] != sorted_ids[:-1])))
    if len(starts) == len(ids):  # no duplicates: sorting was all
        return sorted_ids, rows[order]
    if dtype is None and rows.dtype == np.float16:
        dtype = DType.FLOAT16
    return sorted_ids[starts], narrow(np.add.reduceat(widen(rows[order], dtype), starts, axis=0), dtype)


def widen(rows: np.ndarray, dtype: DType) -> np.ndarray:
    """Rows of a half dtype (float16, or bfloat16 stored as uint16) as float32; others as they are."""
    if dtype not in _HALVES:
        return rows
    wide = np.empty(rows.shape, np.float32)
    accumulate(wide.reshape(-1), np.ascontiguousarray(rows).reshape(-1), dtype, first=True)
    return wide


def narrow(wide: np.ndarray, dtype: DType) -> np.ndarray:
    """float32 rows rounded once (nearest even) to a half ``dtype``'s storage; others as they are."""
    if dtype not in _HALVES:
        return wide
    out = np.empty(wide.shape, dtype.storage)
    finalize(out.reshape(-1), np.ascontiguousarray(wide, dtype=np.float32).reshape(-1), dtype)
    return out


def sparse_dtype(dtype: Any) -> DType:
    """The row dtype a caller means, or ValueError: float32, float64, float16, or bfloat16 given by name
    (``"bfloat16"``, over 16-bit storage) or as ml_dtypes' ``bfloat16``; a uint16 array alone is not taken
    for bfloat16."""
    try:
        code = dtype_of(dtype)
    except (ValueError, TypeError):
        code = None
    if code not in SPARSE_DTYPES:
        names = ", ".join(code.name.lower() for code in SPARSE_DTYPES)
        try:
            shown = str(np.dtype(dtype))
        except TypeError:
            shown = repr(dtype)
        raise ValueError(f"rows of dtype {shown}: a row-sparse push_pull takes {names} (bfloat16 as "
                         "dtype='bfloat16' over 16-bit storage)")
    return code


@dataclasses.dataclass
class SparseRows:
    """A row-sparse push_pull's result: the union of the round's ids (ascending) and their summed (or
    averaged) rows. Unpacks as ``ids, rows = result``."""

    ids: np.ndarray
    rows: np.ndarray

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter((self.ids, self.rows))


@dataclasses.dataclass
class SparseTable:
    """A row-sparse table as this worker uses it; ``rounds``: its push_pulls started so far."""

    name: str
    table_id: int
    num_rows: int
    row_shape: Tuple[int, ...]
    dtype: DType
    rounds: int = 0
    in_flight: bool = False
    held: Any = None  # a server-held table's HeldTable (byteps.common.held_table); None: rows on the workers
    lookups: int = 0  # server-held: lookup messages sent so far (their rounds, apart from the table's rounds)
    asynchronous: bool = False  # server-held in BYTEPS_ENABLE_ASYNC: each process's update applied on arrival
    last_update: Any = None  # server-held: the handle of this rank's last update (a commit waits for it)

    def describe(self) -> str:
        shape = "x".join(map(str, self.row_shape)) or "scalar"
        kind = "server-held table" if self.held is not None else "row-sparse table"
        mode = ", asynchronous" if self.asynchronous else ""
        return f"{kind} {self.name!r} ({self.num_rows} rows of shape {shape}, {self.dtype.name.lower()}{mode})"

    def same_layout(self, num_rows: int, row_shape: Tuple[int, ...], dtype: DType) -> bool:
        return (self.num_rows, self.row_shape, self.dtype) == (num_rows, row_shape, dtype)

    def check_ids(self, ids: Any) -> np.ndarray:
        """``ids`` as int64, or ValueError saying what is wrong (not 1-D integers, or outside the table)."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise ValueError(f"{self.describe()}: row ids must be a 1-D integer array, not {ids.dtype} of "
                             f"shape {ids.shape}")
        if len(ids) and (ids.min() < 0 or ids.max() >= self.num_rows):
            bad = ids[(ids < 0) | (ids >= self.num_rows)]
            raise ValueError(f"{self.describe()}: row ids must lie in [0, {self.num_rows}); got "
                             f"{_sample(bad)}")
        return ids.astype(np.int64, copy=False)

    def check(self, ids: Any, rows: Any) -> Tuple[np.ndarray, np.ndarray]:
        """``ids`` as int64 and ``rows`` as a C-contiguous array, or ValueError saying what is wrong."""
        ids, rows = np.asarray(ids), np.asarray(rows)
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise ValueError(f"{self.describe()}: row ids must be a 1-D integer array, not {ids.dtype} of "
                             f"shape {ids.shape}")
        if rows.dtype != self.dtype.storage:
            raise ValueError(f"{self.describe()}: rows of dtype {rows.dtype}, the table's are "
                             f"{self.dtype.name.lower()}")
        if rows.shape != (len(ids), *self.row_shape):
            raise ValueError(f"{self.describe()}: rows of shape {rows.shape} for {len(ids)} ids; expected "
                             f"{(len(ids), *self.row_shape)}")
        return self.check_ids(ids), np.ascontiguousarray(rows)


def table_layout(num_rows: Any, row_shape: Any, dtype: Any) -> Tuple[int, Tuple[int, ...], DType]:
    """A table's layout as given by a caller, checked: ValueError for a bad one."""
    if not isinstance(num_rows, (int, np.integer)) or isinstance(num_rows, bool) or num_rows <= 0:
        raise ValueError(f"a row-sparse table needs a positive number of rows, not {num_rows!r}")
    try:
        shape = (int(row_shape),) if isinstance(row_shape, (int, np.integer)) else tuple(int(d) for d in row_shape)
    except TypeError:
        raise ValueError(f"a row shape must be a sequence of sizes, not {row_shape!r}") from None
    if any(d <= 0 for d in shape):
        raise ValueError(f"a row shape needs positive sizes, not {shape}")
    return int(num_rows), shape, sparse_dtype(dtype)


def _sample(values: np.ndarray, most: int = 5) -> str:
    shown: List[str] = [str(int(v)) for v in values[:most]]
    return ", ".join(shown) + (f" and {len(values) - most} more" if len(values) > most else "")
