"""Tables held by the servers: how a table's rows start and how its optimizer steps them.

A *held* table (docs/sparse.md, "Tables held by the servers") lives on
the servers, sharded by row id as a row-sparse table's rows are
(:func:`~byteps.common.row_sparse.server_of`). Workers look rows up by id
(a forward pass) and push the gradients of the rows they used (a backward
pass); each server sums a round's gradients by id over the machines and
applies the table's optimizer to those rows once. :class:`HeldTable` is
what every worker declares about a table and the servers keep;
:func:`initial_rows` is how a row starts: drawn from the table's seed and
the row's id alone, so no worker sends anything to create a row and any
process (a test's reference too) can compute it.

Example::

    held = HeldTable(optimizer="adagrad", lr=0.1, seed=7, init_std=0.01)
    rows = initial_rows(held, np.array([3, 1_000_000]), 16)   # (2, 16) float32, the same everywhere
"""

from __future__ import annotations

import dataclasses
import glob
import math
from typing import Any, Dict, Tuple

import numpy as np

__all__ = ["HeldTable", "OPTIMIZERS", "initial_rows", "LOOKUP", "SAVE", "LOAD", "shard_file", "shard_glob",
           "SHARD_PATTERN"]

#: What a PULL flagged FLAG_LOOKUP asks, in its header's ``aux``: the rows of the ids in its payload; or to
#: save the server's shard, or load the table's saved shards, in the directory its JSON payload names.
LOOKUP, SAVE, LOAD = 0, 1, 2
#: A saved shard's file name in its directory: ``<table>.server<k>-of-<servers>.npz``.
SHARD_PATTERN = "{table}.server{server}-of-{servers}.npz"


def shard_file(table: str, server: int, servers: int) -> str:
    """The file server ``server`` of ``servers`` saves its shard of ``table`` to (a name without ``/``)."""
    return SHARD_PATTERN.format(table=_file_safe(table), server=server, servers=servers)


def shard_glob(table: str) -> str:
    """A glob of every shard file of ``table``, saved by any number of servers."""
    return SHARD_PATTERN.format(table=glob.escape(_file_safe(table)), server="*", servers="*")


def _file_safe(table: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in table)

#: The optimizers a server applies per row: plain SGD, Adagrad, and Adam in its lazy (sparse) form, where
#: a row's moments and step count move only in the rounds that touch the row.
OPTIMIZERS = ("sgd", "adagrad", "adam")
_DEFAULT_EPS = {"sgd": 0.0, "adagrad": 1e-10, "adam": 1e-8}


@dataclasses.dataclass(frozen=True)
class HeldTable:
    """A server-held table's optimizer and initial rows; every rank must declare a table alike.

    ``optimizer`` one of :data:`OPTIMIZERS`; ``lr`` its learning rate;
    ``eps`` Adagrad's and Adam's (None: 1e-10 and 1e-8, torch's);
    ``betas`` Adam's; ``initial_accumulator`` Adagrad's. Rows start as
    normal draws of standard deviation ``init_std`` (0: zeros) from
    ``seed`` and the row id.
    """

    optimizer: str = "sgd"
    lr: float = 0.01
    seed: int = 0
    init_std: float = 0.01
    eps: Any = None
    betas: Tuple[float, float] = (0.9, 0.999)
    initial_accumulator: float = 0.0

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"held table: optimizer {self.optimizer!r} is not one of {list(OPTIMIZERS)}")
        if self.eps is None:
            object.__setattr__(self, "eps", _DEFAULT_EPS[self.optimizer])
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        for field, value in (("lr", self.lr), ("init_std", self.init_std), ("eps", self.eps),
                             ("initial_accumulator", self.initial_accumulator)):
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"held table: {field} must be a finite number >= 0, not {value!r}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"held table: betas must be two numbers in [0, 1), not {self.betas!r}")
        if not isinstance(self.seed, int) or not 0 <= self.seed < 1 << 63:
            raise ValueError(f"held table: seed must be an integer in [0, 2**63), not {self.seed!r}")

    def wire(self) -> Dict[str, Any]:
        """The JSON-able form INIT_KEY carries (:meth:`from_wire` reads it back)."""
        return {"optimizer": self.optimizer, "lr": float(self.lr), "seed": self.seed,
                "init_std": float(self.init_std), "eps": float(self.eps), "betas": list(self.betas),
                "initial_accumulator": float(self.initial_accumulator)}

    @classmethod
    def from_wire(cls, fields: Any) -> HeldTable:
        if not isinstance(fields, dict):
            raise ValueError(f"held table: a JSON object expected, not {fields!r}")
        unknown = set(fields) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"held table: unknown settings {sorted(unknown)} (a newer worker?)")
        return cls(**{k: tuple(v) if k == "betas" else v for k, v in fields.items()})

    def describe(self) -> str:
        extra = {"sgd": "", "adagrad": f", eps {self.eps:g}, initial accumulator {self.initial_accumulator:g}",
                 "adam": f", betas {self.betas}, eps {self.eps:g}"}[self.optimizer]
        return (f"{self.optimizer} (lr {self.lr:g}{extra}), rows from seed {self.seed} with std "
                f"{self.init_std:g}")



def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 values (wrapping arithmetic): a well-mixed hash of each."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def initial_rows(held: HeldTable, ids: np.ndarray, row_size: int) -> np.ndarray:
    """The rows ``ids`` start as, float32 of shape (len(ids), row_size): element j of row i is a normal draw
    (Box-Muller over two hashed uniforms) of standard deviation ``held.init_std``, from the table's seed, the
    row id and j only."""
    ids = np.asarray(ids, dtype=np.int64)
    if held.init_std == 0 or not len(ids) or not row_size:
        return np.zeros((len(ids), row_size), np.float32)
    with np.errstate(over="ignore"):
        key = _mix(np.array([held.seed], np.uint64) + np.uint64(0x9E3779B97F4A7C15))
        counters = ids.astype(np.uint64)[:, None] * np.uint64(2 * row_size) + np.arange(2 * row_size,
                                                                                       dtype=np.uint64)
        bits = _mix(counters ^ key)
    uniform = (bits >> np.uint64(11)).astype(np.float64) * 2.0 ** -53  # [0, 1)
    radius = np.sqrt(-2.0 * np.log1p(-uniform[:, 0::2]))
    normal = radius * np.cos(2.0 * np.pi * uniform[:, 1::2])
    return (normal * held.init_std).astype(np.float32)
