"""An embedding table held by the servers: ``ServerEmbedding``, looked up by id, stepped by the servers.

The table lives on byteps' servers, sharded by row id, and never whole on
a worker: a forward pass pulls only the rows its batch uses, a backward
pass pushes their gradients, and each server applies the table's
optimizer to the rows it holds once per round, after every worker's
gradients of the round are summed by id (docs/sparse.md, "Tables held by
the servers"). Rows start from the table's seed and their id, on the
servers, the first time anyone touches them. Example::

    emb = bps.ServerEmbedding(50_000_000, 16, name="user", optimizer="adagrad", lr=0.05)
    out = dense(emb(ids).sum(1))          # ids: a LongTensor of any shape
    loss.backward()                       # the rows' gradients go to the servers
    optimizer.step()                      # the dense parameters (DistributedOptimizer)

Each backward that reaches a lookup's rows is one round of the table, so
every rank must do as many per step (one forward and one backward
through the table, typically; a round waits for every worker). A forward
whose result no backward reaches pushes nothing. The next forward waits
for the servers to have applied the last round. ``eval()`` or
``torch.no_grad()`` lookups push nothing and may run on one rank alone.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch

from byteps.common.frontend.held_embedding import HeldEmbedding

__all__ = ["ServerEmbedding"]


class ServerEmbedding(torch.nn.Module):
    """``num_embeddings`` rows of ``embedding_dim`` float32 held by the servers as table ``name``.

    The arguments as :class:`~byteps.common.frontend.held_embedding.HeldEmbedding`
    (optimizer, learning rate, initial rows, averaging) takes them, which is
    ``table``, the framework-neutral half. Every rank must create the table alike.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, name: str, optimizer: str = "sgd",
                 lr: float = 0.01, seed: int = 0, init_std: float = 0.01, eps: Optional[float] = None,
                 betas: Tuple[float, float] = (0.9, 0.999), initial_accumulator: float = 0.0,
                 average: bool = True) -> None:
        super().__init__()
        self.table = HeldEmbedding(num_embeddings, embedding_dim, name, optimizer, lr, seed, init_std, eps, betas,
                                   initial_accumulator, average)
        self.num_embeddings, self.embedding_dim, self.name = num_embeddings, embedding_dim, name
        self.held = self.table.held

    def extra_repr(self) -> str:
        return self.table.describe()

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows ``ids`` as the servers hold them now (after the last round), without a gradient."""
        _, rows = self._fetch(ids)
        return rows.view(*ids.shape, self.embedding_dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if not (torch.is_grad_enabled() and self.training):
            return self.lookup(ids)
        flat, rows = self._fetch(ids)
        leaf = rows.requires_grad_(True)  # a row per id given: the update sums the rows of one id
        leaf.register_hook(lambda grad, flat=flat: self.table.push(flat, grad.detach().to("cpu").numpy()))
        return leaf.view(*ids.shape, self.embedding_dim)

    def _fetch(self, ids: torch.Tensor) -> Tuple[np.ndarray, torch.Tensor]:
        """The ids given, flat, and their rows (a row per id, repeats included) on the ids' device, once the
        last round is applied."""
        flat = self._ids(ids)
        return flat, torch.from_numpy(self.table.rows(flat)).to(ids.device)

    def save(self, directory: str) -> None:
        """Every server writes its shard of the table (rows and optimizer state) to ``directory`` on its own
        file system. Call it on every rank, between steps: rank 0 asks, after every rank's last round."""
        self.table.save(directory)

    def load(self, directory: str) -> None:
        """The table as saved in ``directory``, by any number of servers. Call it on every rank."""
        self.table.load(directory)

    def flush(self) -> None:
        """Wait until the servers have applied the last round's gradients (the next lookup sees them)."""
        self.table.flush()

    def _ids(self, ids: torch.Tensor) -> np.ndarray:
        if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"ServerEmbedding({self.name!r}): ids must be an int64 or int32 tensor, not "
                             f"{getattr(ids, 'dtype', type(ids).__name__)}")
        return ids.detach().reshape(-1).to("cpu", torch.int64).numpy()
