"""The framework-neutral half of every adapter's ``ServerEmbedding``: a table held by the servers, as numpy.

Each adapter's layer (``byteps.torch.ServerEmbedding``, the Keras layer of
``byteps.tensorflow``, the gluon Block of ``byteps.mxnet``) turns its
framework's ids into flat int64 numpy ids and its framework's gradient into
float32 rows, and leaves the rest to a :class:`HeldEmbedding`: the table's
settings, checked once; the rows of a batch, pulled once the last round is
applied; a round's gradient, pushed after the one before it; save and load
between steps (docs/sparse.md, "Tables held by the servers").

An update in flight belongs to the worker (the membership epoch) it was
pushed in: after an elastic job moves to the next epoch, an update of the
epoch left behind is dropped instead of waited for (its servers are gone,
and the commit the job went back to holds the table as it was).

Example::

    table = HeldEmbedding(1000, 8, "emb", optimizer="adagrad", lr=0.1)
    rows = table.rows(np.array([3, 7, 3]))           # (3, 8) float32, a row per id given
    table.push(np.array([3, 7, 3]), gradients)       # one round; the next rows() waits for it
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from byteps.common import api
from byteps.common.held_table import HeldTable

__all__ = ["HeldEmbedding"]


class HeldEmbedding:
    """``num_embeddings`` rows of ``embedding_dim`` float32 held by the servers as table ``name``, with the
    arguments every adapter's ``ServerEmbedding`` takes (ValueError naming the table for bad ones).

    ``optimizer`` ("sgd", "adagrad" or "adam", lazy: moments per row) with
    ``lr``, ``eps``, ``betas`` and ``initial_accumulator`` as torch's
    optimizers take them; rows start as normal draws of standard deviation
    ``init_std`` from ``seed`` and the row id. ``average``: the servers
    average the workers' gradients (else sum them), as the adapters'
    gradient wrappers do. Every rank must create the table alike.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, name: str, optimizer: str = "sgd",
                 lr: float = 0.01, seed: int = 0, init_std: float = 0.01, eps: Optional[float] = None,
                 betas: Tuple[float, float] = (0.9, 0.999), initial_accumulator: float = 0.0,
                 average: bool = True) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"ServerEmbedding: a table needs a non-empty name, not {name!r}")
        for what, value in (("num_embeddings", num_embeddings), ("embedding_dim", embedding_dim)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ServerEmbedding({name!r}): {what} must be a positive int, not {value!r}")
        self.num_embeddings, self.embedding_dim, self.name, self.average = num_embeddings, embedding_dim, name, average
        self.held = HeldTable(optimizer=optimizer, lr=lr, seed=seed, init_std=init_std, eps=eps, betas=betas,
                              initial_accumulator=initial_accumulator)
        self._update: Any = None  # (the worker it was pushed through, the last round's update in flight)

    def describe(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, name={self.name!r}, {self.held.describe()}"

    @property
    def spec(self) -> Tuple[str, int, Tuple[int, ...], HeldTable]:
        """(name, rows, row shape, HeldTable): what a checkpoint saves of the table."""
        return self.name, self.num_embeddings, (self.embedding_dim,), self.held

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """The rows of ``ids`` (flat int64; a row per id given, repeats included), once the last round is
        applied: (len(ids), embedding_dim) float32."""
        self.flush()
        return api.worker().table_lookup(ids, self.name, self.num_embeddings, (self.embedding_dim,), self.held)

    def push(self, ids: np.ndarray, grads: np.ndarray) -> None:
        """A lookup's rows' gradient (a row per id given): one round of the table, after the one before it;
        the next :meth:`rows` waits for it."""
        rows = np.ascontiguousarray(grads, dtype=np.float32).reshape(len(ids), self.embedding_dim)
        self.flush()
        worker = api.worker()
        self._update = (worker, worker.table_update_async(ids, rows, self.name, self.num_embeddings,
                                                          (self.embedding_dim,), self.held, self.average))

    def flush(self) -> None:
        """Wait until the servers have applied the last round's gradients (the next lookup sees them)."""
        update, self._update = self._update, None
        if update is not None and update[0] is api.worker():  # one of a membership epoch left behind is dropped
            update[1].wait()

    def save(self, directory: str) -> None:
        """Every server writes its shard of the table (rows and optimizer state) to ``directory`` on its own
        file system. Every rank calls it, between steps: rank 0 asks, after every rank's last round."""
        self._on_rank_0(lambda: api.worker().table_save(directory, *self.spec))

    def load(self, directory: str) -> None:
        """The table as saved in ``directory``, by any number of servers. Every rank calls it."""
        self._on_rank_0(lambda: api.worker().table_load(directory, *self.spec))

    def _on_rank_0(self, call: Any) -> None:
        self.flush()
        api.barrier()
        try:
            if api.rank() == 0:
                call()
        finally:
            api.barrier()
