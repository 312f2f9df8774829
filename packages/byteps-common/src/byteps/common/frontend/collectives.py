"""The collectives beyond a sum, written once on raw bytes: allgather, alltoall, reducescatter, Min/Max/Product.

byteps servers sum. Every other collective here is built from two sums:

1. **Describe**: each rank writes one row of a small int64 table (its byte
   count, dtype, shape, and what the collective needs besides, e.g. its
   alltoall splits) and the table is summed, so every rank learns every
   rank's description. Ranks that disagree where they must agree (dtype,
   trailing dimensions, op, root) fail here, on every rank, with a message
   naming the tensor and both sides.
2. **Move**: each rank writes its bytes at its own offset in a zero-filled
   buffer of int32 words and the buffer is summed: adding zeros moves every
   bit pattern exactly, whatever the dtype. The buffer's length is rounded
   up to a power of two, so a name used with varying sizes maps to a
   bounded number of byteps tensors (one per size class).

Each worker pushes its own bytes (the rest of the buffer goes as headers
flagged zeros, which the servers count without summing) and pulls the
other ranks' bytes (its own and the padding are pulled bare: a header
says the round is complete), as a ring allgather moves (n-1)/n of the
result; docs/decisions.md. Reducescatter is the average or sum
of the whole tensor, of which each rank keeps its rows.

Nothing waits at the call: the describe push_pull is started on the
caller's thread (so its tensor is declared in the caller's order, as tensor
ids require), and the move is started from the describe's done-callback,
under an id derived from the describe tensor's
(:meth:`~byteps.common.worker.Worker.derived_id`), which is the same on
every rank whenever it starts. Each function returns a :class:`Started`:
a handle that is done when the move is (or fails with the first step's
error, a disagreement between ranks included), and the step that turns
the buffer into the result.

Adapters pass :class:`Piece` objects (a contiguous numpy view of the
tensor's bytes, its shape and the framework's own dtype name) and turn the
returned pieces back into tensors. Example::

    piece = Piece(np.arange(6, dtype=np.float32).view(np.uint8), (2, 3), "float32")
    started = allgather("x", piece)
    started.core.wait()
    rows = started.finish()                    # Piece of shape (2 * size(), 3)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from byteps.common import api
from byteps.common.frontend.adasum import adasum_tree, check_adasum
from byteps.common.frontend.reductions import BY_GATHER, Adasum, Max, Min, Product, op_name
from byteps.common.handle import Handle, PushPullError
from byteps.common.options import PushPullOptions

__all__ = ["Piece", "RankView", "Started", "allgather", "gather_all", "alltoall", "reducescatter", "reduce_by_gather",
           "split_rows", "row_counts"]

_MAX_DIMS = 8
_DTYPE_WORDS = 3                       # a dtype name of up to 24 bytes
_FIXED = 2 + _DTYPE_WORDS + _MAX_DIMS  # nbytes, ndim, dtype, dims


@dataclasses.dataclass(frozen=True)
class Piece:
    """One rank's tensor as bytes: ``data`` (contiguous uint8), its ``shape`` and its framework dtype name.

    A piece a collective returns is the caller's to keep: its bytes are in memory nothing else reads or
    writes (the adapters make their tensors from them without copying where they can)."""

    data: np.ndarray
    shape: Tuple[int, ...]
    dtype: str
    counts: Tuple[int, ...] = ()  # after an allgather: every rank's first dimension

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1


@dataclasses.dataclass(frozen=True)
class RankView:
    """Which ranks take part and where this rank stands among them (a process set; all ranks by default)."""

    ranks: Tuple[int, ...]
    position: int
    set_id: int = 0  # 0: the global set

    @classmethod
    def everyone(cls) -> RankView:
        return cls(tuple(range(api.size())), api.rank())

    @property
    def size(self) -> int:
        return len(self.ranks)

    def push_pull_async(self, name: str, array: np.ndarray, average: bool = False, output: Any = None,
                        dtype: Any = None, root: Optional[int] = None, tensor_id: Optional[int] = None,
                        nonzero: Optional[Tuple[int, int]] = None,
                        skip_pull: Sequence[Tuple[int, int]] = ()) -> Handle:
        """Start summing (or averaging) ``array`` over these ranks (in place unless ``output``;
        ``root``: a broadcast's; ``tensor_id``: see :meth:`byteps.common.worker.Worker.derived_id`;
        ``nonzero``: the byte range outside which ``array`` is zeros, which then need not travel;
        ``skip_pull``: byte ranges whose sum need not come back: held already, or not read).
        These sums gather: while a rank has joined they fail (see Worker.push_pull_async's ``joinable``)."""
        members = None if self.set_id == 0 else self.ranks
        return api.worker().push_pull_async(array, name, PushPullOptions(
            average=average, output=output, dtype=dtype, members=members, set_id=self.set_id, root=root,
            tensor_id=tensor_id, joinable=False, nonzero=nonzero, skip_pull=tuple(skip_pull)))

    def push_pull(self, name: str, array: np.ndarray, average: bool = False, output: Any = None,
                  dtype: Any = None, root: Optional[int] = None) -> np.ndarray:
        """:meth:`push_pull_async`, waited for."""
        return self.push_pull_async(name, array, average, output, dtype, root).wait()


def _encode_dtype(name: str) -> np.ndarray:
    raw = name.encode()
    if len(raw) > 8 * _DTYPE_WORDS:
        raise ValueError(f"dtype name {name!r} is longer than {8 * _DTYPE_WORDS} bytes")
    return np.frombuffer(raw.ljust(8 * _DTYPE_WORDS, b"\0"), dtype=np.int64)


def _decode_dtype(words: np.ndarray) -> str:
    return words.astype(np.int64).tobytes().rstrip(b"\0").decode(errors="replace")


def _describe_start(name: str, piece: Piece, extra: Sequence[int], view: RankView,
                    family: str) -> Tuple[np.ndarray, Handle]:
    """Step 1, started: this rank's row of the summed table (nbytes, ndim, dtype, shape, extra)."""
    if len(piece.shape) > _MAX_DIMS:
        raise ValueError(f"{family}({name!r}): at most {_MAX_DIMS} dimensions, got shape {piece.shape}")
    table = np.zeros((view.size, _FIXED + len(extra)), dtype=np.int64)
    row = table[view.position]
    row[0], row[1] = piece.data.nbytes, len(piece.shape)
    row[2:2 + _DTYPE_WORDS] = _encode_dtype(piece.dtype)
    row[2 + _DTYPE_WORDS:2 + _DTYPE_WORDS + len(piece.shape)] = piece.shape
    row[_FIXED:] = extra
    return table, view.push_pull_async(f"{name}.describe", table)


def _read_table(table: np.ndarray) -> List[Tuple]:
    """Every rank's (nbytes, shape, dtype name, extra) from the summed table."""
    described = []
    for line in table:
        ndim = int(line[1])
        shape = tuple(int(d) for d in line[2 + _DTYPE_WORDS:2 + _DTYPE_WORDS + ndim])
        described.append((int(line[0]), shape, _decode_dtype(line[2:2 + _DTYPE_WORDS]),
                          tuple(int(x) for x in line[_FIXED:])))
    return described


class _Chained(Handle):
    """The handle of a two-step collective: done when the step started by the first one's callback is."""

    def follow(self, step: Handle) -> None:
        step.add_done_callback(lambda done: self.set_error(done.error) if done.error else self.set_done())


def _then_move(name: str, piece: Piece, extra: Sequence[int], view: RankView, family: str,
               plan: Callable[[List[Tuple]], Started]) -> Started:
    """Describe now; once the table is back (on byteps' communication thread), ``plan(described)`` checks it
    and starts the move. Errors of either step surface at the returned handle's wait()."""
    table, first = _describe_start(name, piece, extra, view, family)
    chained = _Chained(name, None)
    moved: List[Started] = []

    def described(done: Handle) -> None:
        if done.error is not None:
            chained.set_error(done.error)
            return
        try:
            moved.append(plan(_read_table(table)))
        except BaseException as exc:  # a disagreement between ranks: every rank has the same table
            chained.set_error(exc)
            return
        chained.follow(moved[0].core)

    first.add_done_callback(described)
    return Started(chained, lambda: moved[0].finish())


def _size_class(words: int) -> int:
    """``words`` rounded up to a power of two (at least 1)."""
    return 1 << max(0, int(words - 1).bit_length())


@dataclasses.dataclass
class Started:
    """A collective in flight: its push_pull's handle, and what turns the finished buffer into the result."""

    core: Handle
    finish: Callable[[], Any]


def move(name: str, mine: np.ndarray, sizes: Sequence[int], view: RankView,
         then: Callable[[List[np.ndarray]], Any]) -> Started:
    """Step 2, started: every rank's bytes (``sizes[i]`` of rank i) through one summed buffer of int32 words;
    ``then(parts)`` makes the result once it is back."""
    words = [(n + 3) // 4 for n in sizes]
    offsets = np.concatenate([[0], np.cumsum(words)]).astype(np.int64)
    buffer = np.zeros(_size_class(int(offsets[-1])), dtype=np.int32)
    start = int(offsets[view.position]) * 4
    buffer.view(np.uint8)[start:start + mine.nbytes] = mine.reshape(-1).view(np.uint8)
    # Started from a callback, on whatever thread: its id derives from the describe tensor's, not from order.
    size_class = buffer.size.bit_length() - 1
    tensor_id = api.worker().derived_id(f"{name}.describe", size_class, view.set_id)
    # Only this rank's bytes leave the machine; the server counts zeros for the rest (FLAG_ZEROS). Only the
    # other ranks' bytes come back: this rank's own words and the padding are already the sum (FLAG_BARE).
    own = (start, int(offsets[view.position + 1]) * 4)
    core = view.push_pull_async(f"{name}.move.{buffer.size}", buffer, tensor_id=tensor_id,
                                nonzero=(start, start + mine.nbytes),
                                skip_pull=(own, (int(offsets[-1]) * 4, buffer.nbytes)))

    def finish() -> Any:
        raw = buffer.view(np.uint8)
        return then([raw[int(offsets[i]) * 4:int(offsets[i]) * 4 + sizes[i]] for i in range(view.size)])

    return Started(core, finish)


def end_to_end(parts: List[np.ndarray]) -> np.ndarray:
    """The 1-D byte ``parts`` joined: a view when they are slices of one buffer, each beginning where the one
    before ends (as :func:`move`'s are when every size is a multiple of 4), else a copy. Copying 100 MB
    costs about 0.3 s on the rig's cores."""
    filled = [part for part in parts if part.nbytes]  # numpy may place an empty slice anywhere
    if not filled:
        return np.zeros(0, dtype=np.uint8)
    first = filled[0]
    start = address = first.__array_interface__["data"][0]
    for part in filled:
        if part.base is None or part.base is not first.base or part.dtype != np.uint8 or part.strides != (1,) \
                or part.__array_interface__["data"][0] != address:
            return np.concatenate(parts)
        address += part.nbytes
    return np.lib.stride_tricks.as_strided(first, shape=(address - start,), strides=(1,))


def _mismatch(family: str, name: str, what: str, view: RankView, values: Sequence[Any]) -> None:
    """PushPullError (as for the servers' mismatches) naming the first rank whose ``what`` differs from the first's.

    Every rank sees the same table, so every rank raises the same error.
    """
    for i, value in enumerate(values):
        if value != values[0]:
            raise PushPullError(
                f"{family}({name!r}): ranks disagree on the {what}: rank {view.ranks[0]} has {values[0]}, "
                f"rank {view.ranks[i]} has {value}; every rank must pass the same {what}")


def allgather(name: str, piece: Piece, view: Optional[RankView] = None, family: str = "allgather") -> Started:
    """Start gathering the ranks' tensors, concatenated along the first dimension (which may differ by rank)."""
    view = view or RankView.everyone()
    if not piece.shape:
        raise ValueError(f"{family}({name!r}): a scalar (0-d) tensor cannot be gathered along dimension 0; "
                         "reshape it to (1,)")

    def plan(described: List[Tuple]) -> Started:
        _mismatch(family, name, "dtype", view, [d[2] for d in described])
        _mismatch(family, name, "number of dimensions", view, [len(d[1]) for d in described])
        _mismatch(family, name, "shape after the first dimension", view, [d[1][1:] for d in described])
        counts = tuple(d[1][0] for d in described)

        def then(parts: List[np.ndarray]) -> Piece:
            return Piece(end_to_end(parts), (sum(counts), *piece.shape[1:]), piece.dtype, counts)

        return move(name, piece.data, [d[0] for d in described], view, then)

    return _then_move(name, piece, (), view, family, plan)


def gather_all(name: str, piece: Piece, view: Optional[RankView] = None, family: str = "allgather",
               then: Callable[[List[Piece]], Any] = lambda pieces: pieces) -> Started:
    """Start gathering every rank's whole tensor, as it was sent (same dtype and shape on every rank)."""
    view = view or RankView.everyone()

    def plan(described: List[Tuple]) -> Started:
        _mismatch(family, name, "dtype", view, [d[2] for d in described])
        _mismatch(family, name, "shape", view, [d[1] for d in described])
        return move(name, piece.data, [d[0] for d in described], view,
                    lambda parts: then([Piece(part, piece.shape, piece.dtype) for part in parts]))

    return _then_move(name, piece, (), view, family, plan)


def reduce_by_gather(name: str, piece: Piece, op: int, numpy_dtype: np.dtype,
                     view: Optional[RankView] = None) -> Started:
    """Start Min, Max, Product or Adasum over the ranks, from every rank's tensor (``numpy_dtype``: how to
    compute; Adasum: see :mod:`byteps.common.frontend.adasum`)."""
    if op not in BY_GATHER:
        raise ValueError(f"reduce_by_gather computes {', '.join(op_name(o) for o in BY_GATHER)}, not {op_name(op)}")
    if op == Adasum:
        check_adasum((view or RankView.everyone()).size, numpy_dtype, f"allreduce({name!r}, op=Adasum)")

    def then(pieces: List[Piece]) -> np.ndarray:
        arrays = [p.data.view(numpy_dtype).reshape(piece.shape) for p in pieces]
        if op == Adasum:
            return adasum_tree(arrays)
        ufunc = {Min: np.minimum, Max: np.maximum, Product: np.multiply}[op]
        result = arrays[0].copy()
        for array in arrays[1:]:
            ufunc(result, array, out=result)
        return result

    return gather_all(name, piece, view, family=f"allreduce(op={op_name(op)})", then=then)


def row_counts(rows: int, parts: int) -> List[int]:
    """Horovod's split of ``rows`` into ``parts``: the first ``rows % parts`` parts get one row more."""
    base, extra = divmod(rows, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def split_rows(rows: int, parts: int, position: int) -> Tuple[int, int]:
    """(first row, row count) of part ``position`` under :func:`row_counts`."""
    counts = row_counts(rows, parts)
    return sum(counts[:position]), counts[position]


def reducescatter(name: str, array: np.ndarray, dtype: Any, average: bool,
                  view: Optional[RankView] = None) -> Started:
    """Start reducing ``array`` over the ranks; the result is this rank's rows (:func:`split_rows`), a new array.

    The whole tensor is reduced and each rank keeps its rows: every rank's
    tensor must have the same shape, which the servers check. Only this
    rank's rows of the sum come back from the servers.
    """
    view = view or RankView.everyone()
    if array.ndim == 0:
        raise ValueError(f"reducescatter({name!r}): a scalar (0-d) tensor cannot be scattered; "
                         "give it a first dimension")
    reduced = np.empty_like(array)
    first, count = split_rows(array.shape[0], view.size, view.position)
    # Only this rank's rows of the sum come back; the others' are pulled bare.
    row = array.nbytes // max(1, array.shape[0])
    mine = (first * row, (first + count) * row)
    core = view.push_pull_async(name, array, average=average, output=reduced, dtype=dtype,
                                skip_pull=((0, mine[0]), (mine[1], array.nbytes)))
    return Started(core, lambda: reduced[first:first + count].copy())


def alltoall(name: str, piece: Piece, splits: Optional[Sequence[int]], view: Optional[RankView] = None) -> Started:
    """Start sending ``splits[j]`` rows (in order) to the j-th rank; the result is what arrived here and
    how many rows came from whom. Without ``splits`` the first dimension must divide evenly by the ranks."""
    view = view or RankView.everyone()
    family = "alltoall"
    if not piece.shape:
        raise ValueError(f"{family}({name!r}): a scalar (0-d) tensor cannot be split; give it a first dimension")
    rows = piece.shape[0]
    if splits is None:
        if rows % view.size:
            raise ValueError(f"{family}({name!r}): the first dimension ({rows}) does not divide evenly "
                             f"by the number of ranks ({view.size}); pass splits")
        splits = [rows // view.size] * view.size
    splits = [int(s) for s in splits]
    if len(splits) != view.size:
        raise ValueError(f"{family}({name!r}): splits has {len(splits)} entries for {view.size} ranks")
    if any(s < 0 for s in splits) or sum(splits) != rows:
        raise ValueError(f"{family}({name!r}): splits {splits} must be non-negative and add up to the "
                         f"first dimension ({rows})")

    def plan(described: List[Tuple]) -> Started:
        _mismatch(family, name, "dtype", view, [d[2] for d in described])
        _mismatch(family, name, "shape after the first dimension", view, [d[1][1:] for d in described])

        def then(parts: List[np.ndarray]) -> Tuple[Piece, List[int]]:
            received, counts = [], []
            for (_, shape, _, their_splits), part in zip(described, parts):
                before = sum(their_splits[:view.position])
                count = their_splits[view.position]
                their_row = part.nbytes // shape[0] if shape[0] else 0
                received.append(part[before * their_row:(before + count) * their_row])
                counts.append(count)
            return Piece(np.concatenate(received), (sum(counts), *piece.shape[1:]), piece.dtype), counts

        return move(name, piece.data, [d[0] for d in described], view, then)

    return _then_move(name, piece, splits, view, family, plan)
