"""What workers tell each other and the servers about a tensor, and how mismatches are named.

INIT_KEY, the first message a worker sends a server about a key (one
partition of one tensor), carries a :class:`PartitionSpec` as JSON::

    {"name": "fc.weight", "partition": 0, "shape": [512, 10], "tensor_nbytes": 20480,
     "nbytes": 20480, "dtype": 0}

The server checks it (:meth:`PartitionSpec.check`, before allocating
anything) and compares every later worker's with the first; local ranks do
the same with a :class:`TensorDescription` in the first round's LOCAL_READY.
Either way a mismatch fails every rank with both descriptions named.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Any, Optional, Sequence, Tuple

from byteps.common.dtypes import DType

__all__ = ["PartitionSpec", "TensorDescription", "describe_tensor", "dtype_name", "MISMATCH_ADVICE", "quorum_aux",
           "split_quorum_aux", "TAG_NOTICE", "notice_tag", "SPARSE_DTYPES"]

#: The row dtypes a row-sparse table takes (byteps.common.row_sparse; integers are a later step).
SPARSE_DTYPES = (DType.FLOAT32, DType.FLOAT64, DType.FLOAT16, DType.BFLOAT16)

MISMATCH_ADVICE = "every worker must push_pull the same tensors (same names, shapes, dtypes, order)"


def dtype_name(code: int) -> str:
    try:
        return DType(code).name.lower()
    except ValueError:
        return f"dtype code {code}"


def describe_tensor(name: Any, shape: Sequence[int], nbytes: Any, dtype: int) -> str:
    dims = "x".join(map(str, shape or [])) or "scalar"
    return f"tensor {name!r} (shape {dims}, {nbytes} bytes of {dtype_name(dtype)})"


@dataclasses.dataclass(frozen=True)
class TensorDescription:
    """A whole tensor as one local rank sees it (sent in the first round of local aggregation)."""

    name: str
    shape: Tuple[int, ...]
    nbytes: int
    dtype: int
    rank: int = -1  # the worker that describes it; not compared
    on_gpu: bool = False  # summed on the GPU inside the machine (byteps.common.engine.device)

    def same_tensor(self, other: TensorDescription) -> bool:
        return (self.name, tuple(self.shape), self.nbytes, self.dtype, self.on_gpu) == \
            (other.name, tuple(other.shape), other.nbytes, other.dtype, other.on_gpu)

    def describe(self) -> str:
        text = describe_tensor(self.name, self.shape, self.nbytes, self.dtype)
        # named only when on the GPU: the other side of such a mismatch is a CPU tensor or
        # BYTEPS_GPU_LOCAL_AGGREGATION=0
        return f"{text} as a CUDA tensor summed on the GPU" if self.on_gpu else text

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "nbytes": self.nbytes, "dtype": self.dtype,
                "rank": self.rank, **({"on_gpu": True} if self.on_gpu else {})}

    @classmethod
    def from_json(cls, fields: dict) -> TensorDescription:
        return cls(name=fields.get("name"), shape=tuple(fields.get("shape") or ()), nbytes=fields.get("nbytes"),
                   dtype=fields.get("dtype", -1), rank=fields.get("rank", -1), on_gpu=bool(fields.get("on_gpu")))


@dataclasses.dataclass(frozen=True)
class PartitionSpec:
    """One key as INIT_KEY declares it: the tensor, and which partition of it."""

    name: str
    partition: int
    shape: Tuple[int, ...]
    tensor_nbytes: int
    nbytes: int
    dtype: int
    contributors: int = 0  # pushes per round: 0 for every worker machine; a process set's machines otherwise
    compression: Optional[dict] = None  # CompressionSpec.wire() of a compressed tensor
    # Asynchronous (BYTEPS_ENABLE_ASYNC): round 0 broadcasts the initial value into the server's store, every
    # later push is a delta added to it as it comes, and a pull returns the store (docs/async.md)
    asynchronous: bool = False
    quorum: int = 0  # backup workers: an averaging round closes after this many machines' pushes; 0: all of them
    # A row-sparse table's rows held by one server (docs/sparse.md): shape is the table's (rows, *row shape),
    # tensor_nbytes its dense size, nbytes one row's, partition the server; pushes carry (id, row) records
    sparse: bool = False
    # A server-held table's rows (sparse too; HeldTable.wire()): the server keeps them and steps them with this
    # optimizer each round, and answers lookups by id (docs/sparse.md, "Tables held by the servers")
    held: Optional[dict] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    def describe(self) -> str:
        if self.sparse:
            rows = "x".join(map(str, self.shape[1:])) or "scalar"
            kind = "server-held table" if self.held is not None else "row-sparse table"
            mode = ", asynchronous" if self.asynchronous else ""
            return (f"{kind} {self.name!r} ({self.shape[0] if self.shape else '?'} rows of shape {rows}, "
                    f"{dtype_name(self.dtype)}{mode}), the rows of server {self.partition}")
        among = f", summed over {self.contributors} machine(s)" if self.contributors else ""
        compressed = f", compressed with {_compression_text(self.compression)}" if self.compression else ""
        mode = ", asynchronous" if self.asynchronous else \
            f", rounds closed by {self.quorum} machine(s)" if self.quorum else ""
        return (f"{describe_tensor(self.name, self.shape, self.tensor_nbytes, self.dtype)}, "
                f"partition {self.partition} of {self.nbytes} bytes{among}{compressed}{mode}")

    def to_json(self) -> dict:
        return {"name": self.name, "partition": self.partition, "shape": list(self.shape),
                "tensor_nbytes": self.tensor_nbytes, "nbytes": self.nbytes, "dtype": self.dtype,
                **({"contributors": self.contributors} if self.contributors else {}),
                **({"compression": self.compression} if self.compression else {}),
                **({"asynchronous": True} if self.asynchronous else {}),
                **({"quorum": self.quorum} if self.quorum else {}),
                **({"sparse": True} if self.sparse else {}),
                **({"held": self.held} if self.held is not None else {})}

    def check(self, max_partition_bytes: int) -> None:
        """Refuse a description that is inconsistent or asks for too much memory (before allocating)."""
        try:
            dtype = DType(self.dtype)
        except ValueError:
            raise ValueError(f"unknown dtype code {self.dtype}") from None
        elements = 1
        for dim in self.shape:
            if dim < 0:
                raise ValueError(f"negative dimension in shape {self.shape}")
            elements *= dim
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("a tensor needs a non-empty name")
        if not 0 < self.nbytes <= max_partition_bytes or self.nbytes % dtype.itemsize:
            raise ValueError(f"partition of {self.nbytes} bytes: it must be a positive multiple of "
                             f"{dtype.itemsize} and at most {max_partition_bytes} bytes")
        if self.tensor_nbytes != elements * dtype.itemsize or not 0 <= self.partition or self.contributors < 0 \
                or self.quorum < 0 or (self.quorum and self.asynchronous):
            raise ValueError(f"inconsistent description: {self.describe()}")
        if self.sparse and (not self.shape or self.shape[0] <= 0 or self.nbytes * self.shape[0] !=
                            self.tensor_nbytes or self.compression or (self.asynchronous and self.held is None)
                            or self.quorum or self.contributors or dtype not in SPARSE_DTYPES):
            raise ValueError(f"inconsistent description: {self.describe()} (row bytes {self.nbytes}; a row-sparse "
                             "table is uncompressed, of every worker, float32, float64, float16 or bfloat16, and "
                             "synchronous unless the servers hold it)")
        if self.held is not None and (not self.sparse or dtype is not DType.FLOAT32):
            raise ValueError(f"inconsistent description: {self.describe()} (a server-held table is a row-sparse "
                             "float32 table)")


def quorum_aux(machines: int, closed_after: int) -> int:
    """The aux of a quorum key's answer (backup workers): how many machines the sum holds (low 16 bits) and
    how many rounds of the key had closed after the answered one (high 16 bits, at most 0xFFFF)."""
    return machines | min(max(closed_after, 0), 0xFFFF) << 16


def split_quorum_aux(aux: int) -> Tuple[int, int]:
    """(machines, closed_after) of :func:`quorum_aux`."""
    return aux & 0xFFFF, aux >> 16


#: The tag of a sum that gathers (allgather, alltoall, ... built from sums): a rank that joined cannot add zeros.
TAG_GATHER = 1 << 31
#: The tag bit of a layout notice (:func:`notice_tag`): a round that carries no data but says this rank now
#: uses the tensor's name with another shape or dtype; the low 30 bits identify that layout.
TAG_NOTICE = 1 << 30


def notice_tag(layout: str) -> int:
    """The tag of a notice that a name is now used with ``layout`` (a text every rank writes alike)."""
    return TAG_NOTICE | zlib.crc32(layout.encode()) & (TAG_NOTICE - 1)


def describe_op(average: bool, tag: int) -> str:
    """What a worker does with a tensor, for mismatch messages: ``tag`` is 0, 1 + the root of a broadcast,
    :data:`TAG_GATHER` or a :func:`notice_tag`."""
    if tag == TAG_GATHER:
        return "gathers"
    if tag & TAG_NOTICE:
        return f"now uses its name with another shape or dtype (layout {tag & (TAG_NOTICE - 1):#x})"
    if tag:
        return f"broadcasts from rank {tag - 1}"
    return "averages" if average else "sums"


def _compression_text(fields: dict) -> str:
    return " ".join(f"{key}={value}" for key, value in sorted(fields.items()) if value not in (None, False))
