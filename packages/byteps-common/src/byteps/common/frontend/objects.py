"""broadcast_object and allgather_object: picklable objects between ranks, framework-free.

The root pickles the object; its size goes first (-1 when pickling failed,
so the others raise instead of waiting), then the bytes as int64 words in a
buffer rounded up to a power of two, so repeated calls reuse a few tensor
names. Every other rank pushes zeros: the sum is the root's bytes.

allgather_object gathers every rank's pickle with the front's allgather
(:mod:`byteps.common.frontend.collectives`), whose first dimension may
differ between ranks. Neither involves a framework tensor, so both work
the same eagerly and in a TF1 graph. Example::

    epoch = broadcast_object(epoch, root_rank=0, name="epoch")
    losses = allgather_object(loss, name="loss")     # [rank 0's, rank 1's, ...]
"""

from __future__ import annotations

import pickle
from typing import Any, List, Optional

import numpy as np

from byteps.common import api

__all__ = ["broadcast_object", "allgather_object"]


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None, process_set: Any = None) -> Any:
    """Return the root's ``obj`` on every rank (of ``process_set``; pickled, its size goes first).

    The root gets its own ``obj`` back; the others may pass anything (None).
    Without ``name`` all calls share one name (Horovod uses the type's name,
    which breaks when other ranks pass None).
    """
    from byteps.common.frontend.process_sets import broadcast_view
    worker = api.worker()
    view = broadcast_view(root_rank, process_set, "broadcast_object")
    name = "broadcast_object" if name is None else f"broadcast_object.{name}"
    is_root = worker.rank == root_rank
    payload, failure = b"", None
    if is_root:
        try:
            payload = pickle.dumps(obj)
        except Exception as exc:  # tell the others (size -1) instead of leaving them waiting
            failure = exc
    nbytes = np.array([(-1 if failure else len(payload)) if is_root else 0], dtype=np.int64)
    view.push_pull(f"{name}.size", nbytes, root=root_rank)
    size = int(nbytes[0])
    if size < 0:
        if failure is not None:
            raise failure
        raise ValueError(f"broadcast_object: rank {root_rank} could not pickle its object (see its error)")
    capacity = 8
    while capacity < size:
        capacity *= 2
    words = np.zeros(capacity // 8, dtype=np.int64)
    if is_root:
        words.view(np.uint8)[:size] = np.frombuffer(payload, dtype=np.uint8)
    view.push_pull(f"{name}.{capacity}", words, root=root_rank)
    if is_root:
        return obj
    return pickle.loads(words.view(np.uint8)[:size].tobytes())


def allgather_object(obj: Any, name: Optional[str] = None, process_set: Any = None) -> List[Any]:
    """Every rank's picklable ``obj`` (of ``process_set``), in rank order."""
    from byteps.common.frontend import collectives
    from byteps.common.frontend.process_sets import rank_view
    payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
    key = "allgather_object" if name is None else f"allgather_object.{name}"
    started = collectives.allgather(key, collectives.Piece(payload, (payload.size,), "uint8"), rank_view(process_set),
                                    family="allgather_object")
    started.core.wait()
    gathered = started.finish()
    objects, start = [], 0
    for count in gathered.counts:
        objects.append(pickle.loads(gathered.data[start:start + count].tobytes()))
        start += count
    return objects
