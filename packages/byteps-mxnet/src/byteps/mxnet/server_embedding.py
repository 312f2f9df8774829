"""An embedding table held by the servers: ``ServerEmbedding``, looked up by id, stepped by the servers.

MXNet's counterpart of ``byteps.torch.ServerEmbedding`` (docs/sparse.md,
"Tables held by the servers"). The table lives on byteps' servers, sharded
by row id, and never whole on a worker: a forward pass pulls only the rows
its batch uses, a backward pass pushes their gradients, and each server
applies the table's optimizer to the rows it holds once per round, after
every worker's gradients of the round are summed by id. Rows start from
the table's seed and their id, on the servers, the first time anyone
touches them. Example::

    emb = bps.ServerEmbedding(50_000_000, 16, name="user", optimizer="adagrad", lr=0.05)
    dense = gluon.nn.Dense(1)
    trainer = bps.DistributedTrainer(dense.collect_params(), "sgd", {"learning_rate": 0.05})
    with autograd.record():
        loss = ((dense(emb(ids).sum(1)) - y) ** 2).mean()   # ids: an integer NDArray or numpy array
    loss.backward()                    # the rows' gradients go to the servers
    trainer.step(1)                    # the dense parameters only: the table has no gluon Parameter

How the gradient reaches the servers: MXNet has no tensor hooks, so a
training lookup goes through an ``mx.autograd.Function`` (``_Round``). Its
forward returns the pulled rows (an NDArray with a gradient buffer,
``attach_grad``), reshaped to ``ids.shape + (dim,)``; its backward receives
the rows' gradient, starts the round's ``table_update_async`` with it, and
passes the gradient on to that buffer. MXNet runs a Function's backward on
its engine, after ``loss.backward()`` returns, in a thread of its own: the
next lookup (``flush``) first waits for the gradient buffers of the
lookups whose backward was issued (an engine write, so this waits for
exactly the backwards issued, and for nothing when none was), then for the
servers to have applied the round.

Each backward that reaches a lookup's rows is one round of the table, so
every rank must do as many per step (one forward and one backward through
the table, typically; a round waits for every worker). Keep it to one
lookup per step under ``autograd.record()`` (concatenate the ids of several
fields): MXNet's engine may run the backwards of two lookups in either
order, and rounds must come in one order on every rank. A forward whose
result no backward reaches pushes nothing. Lookups outside
``autograd.record()``, or under ``record(train_mode=False)``, push nothing
and may run on one rank alone.

It is a ``gluon.Block``, not a ``HybridBlock``: it cannot be hybridized
(its forward talks to the servers). A parent ``Block``'s ``hybridize()``
leaves it imperative, and a ``HybridBlock`` refuses it as a child.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, List, Optional, Tuple

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from byteps.common.frontend.held_embedding import HeldEmbedding

__all__ = ["ServerEmbedding"]

#: Integer dtypes taken as ids (NDArray or numpy); others are a ValueError.
ID_DTYPES = (np.int32, np.int64, np.uint8, np.int8)


class _Round(autograd.Function):
    """A training lookup's rows in the graph: forward reshapes them, backward pushes their gradient as one
    round of the table (``ServerEmbedding._push``) and hands it on to the rows' gradient buffer."""

    def __init__(self, table: ServerEmbedding, ids: np.ndarray, rows: mx.nd.NDArray, shape: Tuple[int, ...]):
        super().__init__()
        self.table, self.ids, self.rows, self.shape = table, ids, rows, shape
        self.pushed = False

    def forward(self, rows: mx.nd.NDArray) -> mx.nd.NDArray:
        return rows.reshape(self.shape).copy()

    def backward(self, grad: mx.nd.NDArray) -> mx.nd.NDArray:
        flat = grad.reshape(self.rows.shape)
        try:
            self.table._push(self.ids, flat)
        finally:
            self.pushed = True
        return flat


class ServerEmbedding(gluon.Block):
    """``num_embeddings`` rows of ``embedding_dim`` float32 held by the servers as table ``name``.

    The arguments as :class:`~byteps.common.frontend.held_embedding.HeldEmbedding`
    (optimizer, learning rate, initial rows, averaging) takes them, which is
    ``table``, the framework-neutral half. Every rank must create the table
    alike. A ``gluon.Block`` that cannot be hybridized (module docstring);
    it has no gluon Parameters, so a trainer steps only the dense ones.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, name: str, optimizer: str = "sgd",
                 lr: float = 0.01, seed: int = 0, init_std: float = 0.01, eps: Optional[float] = None,
                 betas: Tuple[float, float] = (0.9, 0.999), initial_accumulator: float = 0.0,
                 average: bool = True) -> None:
        table = HeldEmbedding(num_embeddings, embedding_dim, name, optimizer, lr, seed, init_std, eps, betas,
                              initial_accumulator, average)
        super().__init__()
        self.table = table  # the framework-neutral half (byteps.common.frontend.held_embedding)
        self.table_name = name  # the table's name at the servers (gluon's Block.name is the block's prefix)
        self.num_embeddings, self.embedding_dim, self.held = num_embeddings, embedding_dim, table.held
        self._lock = threading.Lock()  # the table's update and _error, also set by backward in MXNet's thread
        self._error: Optional[BaseException] = None  # a backward's failure, raised by the next flush
        self._pending: List[Any] = []  # weak references to the training lookups whose backward may come

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.table.describe()})"

    def lookup(self, ids: Any) -> mx.nd.NDArray:
        """The rows ``ids`` as the servers hold them now (after the last round), without a gradient."""
        shape, flat, context = self._ids(ids)
        return mx.nd.array(self._fetch(flat), ctx=context, dtype=np.float32).reshape(shape + (self.embedding_dim,))

    def forward(self, ids: Any) -> mx.nd.NDArray:
        if not (autograd.is_recording() and autograd.is_training()):
            return self.lookup(ids)
        shape, flat, context = self._ids(ids)
        rows = mx.nd.array(self._fetch(flat), ctx=context, dtype=np.float32)  # a row per id given
        rows.attach_grad()
        round_ = _Round(self, flat, rows, shape + (self.embedding_dim,))
        self._pending.append(weakref.ref(round_))
        return round_(rows)

    def hybridize(self, active: bool = True, **kwargs: Any) -> None:
        """Nothing to hybridize: the lookups stay imperative (a parent Block's hybridize() reaches here)."""

    def _fetch(self, flat: np.ndarray) -> np.ndarray:
        """The rows of the ids ``flat`` (a row per id, repeats included), once the last round is applied."""
        self.flush()
        return self.table.rows(flat)

    def save(self, directory: str) -> None:
        """Every server writes its shard of the table (rows and optimizer state) to ``directory`` on its own
        file system. Call it on every rank, between steps: rank 0 asks, after every rank's last round."""
        self.flush()
        self.table.save(directory)

    def load(self, directory: str) -> None:
        """The table as saved in ``directory``, by any number of servers. Call it on every rank."""
        self.flush()
        self.table.load(directory)

    def flush(self) -> None:
        """Wait until the servers have applied the last round's gradients (the next lookup sees them): first
        for the backwards already issued through this table's lookups to have pushed them."""
        waiting = []
        for ref in self._pending:
            round_ = ref()
            if round_ is not None and not round_.pushed:
                round_.rows.grad.wait_to_read()  # the backward's write, if loss.backward() issued it
                if not round_.pushed:
                    waiting.append(ref)  # no backward yet: it may come later
        self._pending = waiting
        with self._lock:
            error, self._error = self._error, None
            if error is None:
                self.table.flush()
        if error is not None:
            raise error

    def _ids(self, ids: Any) -> Tuple[Tuple[int, ...], np.ndarray, Any]:
        """``ids``' shape, the ids flat as int64, and the context of the rows (the ids', else the CPU)."""
        dtype = getattr(ids, "dtype", None)
        if not isinstance(ids, (mx.nd.NDArray, np.ndarray)) or np.dtype(dtype) not in ID_DTYPES:
            what = np.dtype(dtype).name if isinstance(ids, (mx.nd.NDArray, np.ndarray)) else type(ids).__name__
            raise ValueError(f"ServerEmbedding({self.table_name!r}): ids must be an integer NDArray or numpy "
                             f"array (int64, int32, int8 or uint8), not {what} (ids.astype('int64'))")
        if isinstance(ids, mx.nd.NDArray):
            if ids.stype != "default":
                raise ValueError(f"ServerEmbedding({self.table_name!r}): ids must be dense, not {ids.stype}")
            return tuple(ids.shape), ids.asnumpy().reshape(-1).astype(np.int64), ids.context
        return tuple(ids.shape), np.ascontiguousarray(ids).reshape(-1).astype(np.int64), mx.cpu()

    def _push(self, ids: np.ndarray, grad: mx.nd.NDArray) -> None:
        """A training lookup's rows' gradient (its backward, in MXNet's custom-op thread): one round of the
        table, after the one before it. A failure is kept for the next flush to raise on the calling thread."""
        with self._lock:
            try:
                self.table.push(ids, grad.asnumpy())
            except BaseException as exc:  # raised by the next flush, not lost in MXNet's thread
                if self._error is None:
                    self._error = exc
