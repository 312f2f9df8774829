"""Which tensors a worker knows: their ids, their rounds, which are in flight, where their partitions go.

Tensor ids come from declaration order, as in BytePS: every worker must
declare (or first push_pull) its tensors in the same order. Each process
set numbers its own tensors (its id above :data:`SET_ID_SHIFT` bits of the
set's own tensor number): ranks outside a set never see its tensors and
must still agree on the numbers of the others. A *derived* id
(:meth:`TensorRegistry.derived_id`) belongs to a declared tensor and is the
same on every rank whatever the order in which ranks start such tensors,
for push_pulls started from callbacks.

A name is *in flight* from the start of its push_pull until its handle is
done; starting it again meanwhile is a ValueError, raised before anything is
sent. Each start counts one round of the name.

A name whose first round failed on every rank (the ranks disagreed on what
it is) is *retired* (:meth:`TensorRegistry.first_round_failed`): it leaves
the registry as if never declared, and its next use declares it afresh,
with the next id in declaration order (never a derived one), so nothing of
the failed declaration (its size, its server keys, the adapters' layout of
it: see :meth:`TensorRegistry.on_retire`) stays behind to fail later rounds.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from byteps.common.in_flight import NamesInFlight
from byteps.common.options import MAX_PROCESS_SET_ID
from byteps.common.partition import PartitionPlan
from byteps.common.server_assignment import ServerAssigner

__all__ = ["TensorRegistry", "SET_ID_SHIFT", "RESERVED_SET", "SPARSE_TABLE_SET"]

#: A tensor id is its process set's id above this many bits of the set's own tensor number.
SET_ID_SHIFT = 32
#: Set-id bit of derived ids; process set ids stay below it.
_DERIVED_SETS = 1 << 15
#: The set id of the worker's own bookkeeping tensors (join's state exchange); no process set gets it.
RESERVED_SET = MAX_PROCESS_SET_ID + 1
assert RESERVED_SET == _DERIVED_SETS - 1
#: The set id of row-sparse tables (byteps.common.row_sparse): no process set gets it (they stop at
#: MAX_PROCESS_SET_ID) and derived and reserved ids carry _DERIVED_SETS, so a table's keys never meet a tensor's.
SPARSE_TABLE_SET = RESERVED_SET


class TensorRegistry:
    """The tensors of one worker, safe to use from any thread. ``assigner`` places partitions (None: the
    worker has no servers)."""

    def __init__(self, assigner: Optional[ServerAssigner]) -> None:
        self.assigner = assigner
        self._lock = threading.Lock()
        self._ids: Dict[str, int] = {}
        self._next_ids: Dict[int, int] = {}  # process set id -> its next tensor number
        self._rounds: Dict[str, int] = {}
        self._in_flight = NamesInFlight()
        self.closed = False
        self.first_start: Optional[float] = None  # time.monotonic() of the first push_pull
        self.last_done = 0.0  # time.monotonic() when the last push_pull finished
        self._rounds_behind: Optional[int] = None  # backup workers: see take_rounds_behind()
        self._retired: set = set()  # names whose first round failed on every rank (declared afresh since)
        self._retire_listeners: List[Callable[[str], None]] = []

    def declare(self, name: str, nbytes: Optional[int] = None, itemsize: Optional[int] = None) -> int:
        """Give ``name`` the next tensor id (idempotent); with its size, place its partitions now."""
        with self._lock:
            is_new = name not in self._ids
            tensor_id = self._declare_locked(name)
            if nbytes is not None and self.assigner is not None:
                self.assigner.plan(tensor_id, nbytes, itemsize or 1, balanced=is_new)
            return tensor_id

    def _declare_locked(self, name: str, set_id: int = 0, tensor_id: Optional[int] = None) -> int:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a tensor name must be a non-empty string, got {name!r}")
        if tensor_id is not None:
            known = self._ids.setdefault(name, tensor_id)
            if known != tensor_id:
                raise ValueError(f"tensor {name!r} has id {known}, not {tensor_id}")
            self._rounds.setdefault(name, 0)
            return tensor_id
        if name not in self._ids:
            number = self._next_ids.get(set_id, 0)
            self._next_ids[set_id] = number + 1
            self._ids[name] = set_id << SET_ID_SHIFT | number
            self._rounds[name] = 0
        return self._ids[name]

    def begin(self, name: str, set_id: int, tensor_id: Optional[int], nbytes: int, itemsize: int,
              check_round: Optional[Callable[[int], None]] = None) -> Tuple[int, int, Optional[PartitionPlan]]:
        """Start a round of ``name``: (its id, the round, its partition plan); the name is in flight until
        :meth:`finished`. ValueError if it is in flight already or changed size, or whatever
        ``check_round(round)`` raises (before the round is counted)."""
        with self._lock:
            if self.closed:
                raise RuntimeError("push_pull after shutdown(): call init() again first")
            self._in_flight.reserve([name], _in_flight_text)
            try:
                return self._begin_locked(name, set_id, tensor_id, nbytes, itemsize, check_round)
            except BaseException:
                self._in_flight.release(name)
                raise

    def _begin_locked(self, name: str, set_id: int, tensor_id: Optional[int], nbytes: int, itemsize: int,
                      check_round: Optional[Callable[[int], None]]) -> Tuple[int, int, Optional[PartitionPlan]]:
        is_new, derived = name not in self._ids, tensor_id is not None
        tensor_id = self._declare_locked(name, set_id, tensor_id)
        plan = None
        if self.assigner is not None:  # raises if the size changed: before the round is counted
            # A set's tensors, and tensors with derived ids, are placed by hash: the balanced placement follows
            # the order in which a rank declares tensors, which differs between sets and for tensors started
            # from callbacks.
            plan = self.assigner.plan(tensor_id, nbytes, itemsize, balanced=is_new and not set_id and not derived)
        round_ = self._rounds[name]
        if check_round is not None:
            check_round(round_)
        self._rounds[name] = round_ + 1
        if self.first_start is None:
            self.first_start = time.monotonic()
        return tensor_id, round_, plan

    def declared(self, name: str) -> bool:
        """Whether ``name`` has an id here."""
        with self._lock:
            return name in self._ids

    def wait_idle(self, name: str) -> None:
        """Return once no push_pull of ``name`` is in flight."""
        self._in_flight.wait_free(name)

    def finished(self, name: str, closed_after: Optional[int] = None) -> None:
        self._in_flight.release(name)
        with self._lock:
            self.last_done = time.monotonic()
            if closed_after is not None:
                known = self._rounds_behind
                self._rounds_behind = closed_after if known is None else min(known, closed_after)

    def first_round_failed(self, name: str, tensor_id: int) -> None:
        """A tensor's first round failed on every rank (ranks that disagree on it, or on its size), while it is
        still in flight: its bytes leave the balancing counters, which may hold another size on each rank (see
        server_assignment), and the name is retired: its next use declares it afresh, on every rank alike
        (each saw the round fail before it could use the name again). The listeners of :meth:`on_retire`
        hear of it before the caller does."""
        if self.assigner is not None:
            self.assigner.unbalance(tensor_id)
        with self._lock:
            if self._ids.get(name) != tensor_id:
                return
            del self._ids[name]
            del self._rounds[name]
            self._retired.add(name)
            listeners = list(self._retire_listeners)
        for listener in listeners:
            listener(name)

    def on_retire(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(name)`` whenever a name is retired (:meth:`first_round_failed`): whoever keeps
        something of a name's last use (a layout notice's tensor, an adapter's layout list) forgets it."""
        with self._lock:
            if listener not in self._retire_listeners:
                self._retire_listeners.append(listener)

    def retired(self, name: str) -> bool:
        """Whether ``name`` was retired once: its id, if declared again, comes from declaration order."""
        with self._lock:
            return name in self._retired

    def take_rounds_behind(self) -> int:
        with self._lock:
            behind, self._rounds_behind = self._rounds_behind, None
        return behind or 0

    def derived_id(self, name: str, variant: int, set_id: int = 0) -> int:
        """An id for a tensor that belongs to the declared tensor ``name`` (of process set ``set_id``)."""
        if set_id:
            name = f"{name} (process set {set_id})"
        with self._lock:
            base = self._ids.get(name)
        if base is None or not 0 <= variant < 64:
            raise ValueError(f"derived_id({name!r}, {variant}): declare the tensor first; variant below 64")
        number = base & ((1 << SET_ID_SHIFT) - 1)
        if number >= 1 << (SET_ID_SHIFT - 6):
            raise ValueError(f"derived_id({name!r}): too many tensors declared before it")
        return (_DERIVED_SETS | base >> SET_ID_SHIFT) << SET_ID_SHIFT | number << 6 | variant

    @staticmethod
    def reserved_id(number: int) -> int:
        """The id of the worker's own bookkeeping tensor ``number`` (join's state exchange)."""
        return (_DERIVED_SETS | RESERVED_SET) << SET_ID_SHIFT | number

    @property
    def tensor_ids(self) -> Dict[str, int]:
        """Every name this worker knows, with its id (a copy)."""
        with self._lock:
            return dict(self._ids)

    @property
    def max_round(self) -> int:
        with self._lock:
            return max(self._rounds.values(), default=0)

    # --- agreement after join -------------------------------------------------------------
    def export(self) -> Dict[str, Any]:
        """What this worker declared, its rounds and placements (JSON-able), for the others after a join."""
        with self._lock:
            return {"ids": dict(self._ids), "rounds": dict(self._rounds), "retired": sorted(self._retired),
                    "next": {str(k): v for k, v in self._next_ids.items()},
                    "placement": self.assigner.export() if self.assigner is not None else None}

    def adopt(self, states: List[Dict[str, Any]]) -> None:
        """Take in every rank's :meth:`export`: declarations this rank missed, the furthest rounds, and the
        placements of the rank that declared most (it has seen every declaration: they come in one order)."""
        leader = max(states, key=lambda state: len(state["ids"]))
        with self._lock:
            for state in states:
                for name, tensor_id in state["ids"].items():
                    known = self._ids.setdefault(name, tensor_id)
                    if known != tensor_id:
                        raise RuntimeError(f"join: tensor {name!r} has id {known} here and {tensor_id} on another "
                                           "rank; every rank must declare the same tensors in the same order")
                for name, round_ in state["rounds"].items():
                    self._rounds[name] = max(self._rounds.get(name, 0), round_)
                for set_id, number in state["next"].items():
                    self._next_ids[int(set_id)] = max(self._next_ids.get(int(set_id), 0), number)
                self._retired.update(state.get("retired", ()))
            if self.assigner is not None:
                self.assigner.adopt(leader["placement"])


def _in_flight_text(name: str) -> str:
    return (f"push_pull({name!r}): a push_pull of this name is still in flight; "
            "wait for its handle before submitting it again")
