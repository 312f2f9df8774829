"""Save and resume training across restarts of the job (bpslaunch --max-restarts, docs/reliability.md).

    resumed = bps.load_checkpoint(directory, model, optimizer)     # every rank, at the start
    first_epoch = resumed["step"] + 1 if resumed else 1
    for epoch in range(first_epoch, epochs + 1):
        ...
        bps.save_checkpoint(directory, model, optimizer, step=epoch)   # every rank; rank 0 writes

Rank 0 writes ``<directory>/checkpoint`` atomically (the previous one
stays whole if the job dies while saving). ``load_checkpoint`` must be
called by every rank: rank 0 reads the file and the others get the model,
the optimizer's state and the step through broadcasts, so the directory
need only exist where rank 0 runs.

A model's :class:`~byteps.torch.ServerEmbedding` tables, which live on the
servers, are saved by the servers into ``<directory>/held-tables/`` with
each checkpoint and loaded into a restarted job's servers by
``load_checkpoint`` (byteps.common.frontend.checkpoint): that folder must
be the same path where the servers run (one machine, or a shared file
system).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

import torch

from byteps.common import api
from byteps.common.frontend.checkpoint import (
    CHECKPOINT_FILE,
    HeldTableSpec,
    drop_older_held_tables,
    load_held_tables,
    save_held_tables,
    write_atomically,
)
from byteps.torch.functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from byteps.torch.server_embedding import ServerEmbedding

__all__ = ["save_checkpoint", "load_checkpoint"]


def save_checkpoint(directory: str, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                    step: int = 0, extra: Any = None) -> Optional[str]:
    """Rank 0 writes the model's and optimizer's state, ``step`` and ``extra`` (anything torch.save takes);
    returns the file's path on rank 0, None on the others (which write nothing)."""
    if api.rank() != 0:
        return None
    held = save_held_tables(directory, _held_tables(model), step)
    state = {"step": int(step), "model": model.state_dict(),
             "optimizer": optimizer.state_dict() if optimizer is not None else None, "extra": extra,
             "held_tables": held}
    path = os.path.join(directory, CHECKPOINT_FILE)
    write_atomically(path, lambda out: torch.save(state, out))
    drop_older_held_tables(directory, held)
    return path


def load_checkpoint(directory: str, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None
                    ) -> Optional[Dict[str, Any]]:
    """Every rank: the checkpoint rank 0 finds in ``directory`` into ``model`` (and ``optimizer``), on every
    rank; returns ``{"step": ..., "extra": ...}``, or None when rank 0 finds none (nothing changes then)."""
    found = None
    if api.rank() == 0:
        path = os.path.join(directory, CHECKPOINT_FILE)
        if os.path.exists(path):
            state = torch.load(path, map_location="cpu", weights_only=False)
            model.load_state_dict(state["model"])
            if optimizer is not None and state["optimizer"] is not None:
                optimizer.load_state_dict(state["optimizer"])
            load_held_tables(directory, state.get("held_tables"), _held_tables(model))
            found = {"step": state["step"], "extra": state["extra"]}
    found = broadcast_object(found, root_rank=0, name="byteps.checkpoint")
    if found is not None:
        broadcast_parameters(model.state_dict(), root_rank=0)
        if optimizer is not None:
            broadcast_optimizer_state(optimizer, root_rank=0)
    return found


def _held_tables(model: torch.nn.Module) -> List[HeldTableSpec]:
    """The model's ServerEmbedding tables, each with its last update applied (rank 0's, hence the round's: a
    synchronous round is applied once every machine pushed it)."""
    tables = []
    for module in model.modules():
        if isinstance(module, ServerEmbedding):
            module.flush()
            tables.append(module.table.spec)
    return tables
