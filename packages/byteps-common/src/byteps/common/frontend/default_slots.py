"""Which default name an unnamed op gets: the slots of an op family.

An unnamed op of family ``f`` is named ``"f.noname.<slot>"``, one of
:data:`WINDOW` slots. Each name is a byteps tensor per shape it is used
with, set up at its first use, and a name used with another shape than at
its last use first announces the switch to the other ranks (a round of
headers; :mod:`byteps.common.frontend.names`). So the slot should be one
whose name last carried the op's shape, and it must be the same on every
rank without the ranks talking: the choice may depend only on what every
rank that runs the same program has seen alike.

* An op holds its slot from its call until its caller is done with it:
  the adapter's ``synchronize()`` or the call's refusal, points of the
  program's order (not the op's end, which comes at different times on
  different ranks). Only a free slot is taken.
* The slot wanted is ``k mod p``, ``k`` counting the family's ops whose
  shape was recorded and ``p`` the shortest period (up to
  :data:`MAX_PERIOD`) of their last ``2 * MAX_PERIOD`` shapes, 1 where
  they do not repeat: a
  blocking call of one shape reuses slot 0 (one tensor, set up once), a
  loop over two shapes (a gradient and a metric) settles on two slots, one
  per shape, and switches nothing. The op's own shape is not consulted: a
  rank that passes another shape than the others meets them on the same
  name, where the switch's announcement fails on every rank instead of
  each rank waiting on a tensor of its own.
* Where the slot wanted is held, the lowest free one; where every slot is
  held (handles never synchronized, or TensorFlow and MXNet, whose ops have
  no ``synchronize()`` in the program and free none), the one held longest,
  whose op the new one then waits for (names in flight): unnamed ops cycle
  through the window's names and memory stays flat.
* A refused call takes its op back: its slot is free and its shape
  forgotten, so the next call gets what the others' matching call got.

Example::

    slot, op = SLOTS.take("allreduce")         # (0, 0)
    SLOTS.record("allreduce", op, "((4,), 'float32')")
    SLOTS.free("allreduce", slot, op)          # synchronized
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Deque, Dict, Optional, Tuple

__all__ = ["WINDOW", "MAX_PERIOD", "DefaultSlots", "SLOTS"]

#: How many default names each op family has.
WINDOW = 16
#: The longest repeating pattern of shapes that settles on a slot per shape.
MAX_PERIOD = 8


@dataclasses.dataclass
class _Family:
    issued: int = 0                                   # unnamed ops issued so far (refused ones included)
    held: Dict[int, int] = dataclasses.field(default_factory=dict)  # slot -> the op holding it
    recent: Deque[Tuple[int, str]] = dataclasses.field(   # (op, layout) of the latest ops, in order
        default_factory=lambda: collections.deque(maxlen=2 * MAX_PERIOD))
    recorded: int = 0                                 # ops whose layout was recorded (taken back: not counted)


class DefaultSlots:
    """The slots of every op family in this process (one instance, :data:`SLOTS`; thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: Dict[str, _Family] = {}

    def take(self, family: str) -> Tuple[int, int]:
        """(slot, op): the slot the next unnamed op of ``family`` holds, and the op's number."""
        with self._lock:
            state = self._families.setdefault(family, _Family())
            op = state.issued
            state.issued += 1
            wanted = state.recorded % _period([layout for _, layout in state.recent])
            slot: Optional[int] = wanted if wanted not in state.held else next(
                (s for s in range(WINDOW) if s not in state.held), None)
            if slot is None:
                slot = min(state.held, key=state.held.__getitem__)
            state.held[slot] = op
            return slot, op

    def record(self, family: str, op: int, layout: str) -> None:
        """Op ``op`` of ``family`` has the layout ``layout`` (its shape and dtype, as every rank writes it)."""
        with self._lock:
            state = self._families.setdefault(family, _Family())
            state.recent.append((op, layout))
            state.recorded += 1

    def free(self, family: str, slot: int, op: int, taken_back: bool = False) -> None:
        """The caller is done with op ``op`` (synchronized, or ``taken_back``: refused, its layout forgotten).
        Its slot is free unless a later op has taken it since."""
        with self._lock:
            state = self._families.get(family)
            if state is None:
                return
            if state.held.get(slot) == op:
                del state.held[slot]
            if taken_back:
                for entry in state.recent:
                    if entry[0] == op:
                        state.recent.remove(entry)
                        state.recorded -= 1
                        break

    def counters(self) -> Dict[str, int]:
        """Each family's ops issued so far (:func:`~byteps.common.frontend.names.join_state`)."""
        with self._lock:
            return {family: state.issued for family, state in self._families.items()}

    def restart(self, counters: Dict[str, int]) -> None:
        """After a join: the ranks missed different ops, so each family starts afresh (nothing held, no shapes
        seen), the op counts continuing from ``counters`` where larger."""
        with self._lock:
            for family, count in counters.items():
                state = self._families.setdefault(family, _Family())
                state.issued = max(state.issued, count)
            for state in self._families.values():
                state.held.clear()
                state.recent.clear()
                state.recorded = 0


def _period(layouts: list) -> int:
    """The shortest p <= MAX_PERIOD with which all of ``layouts`` (at least 2p of them) repeat; 1 if none.
    All of them, not only the last 2p: in a, a, b, a, a, b the last two alone would give 1."""
    n = len(layouts)
    for p in range(1, MAX_PERIOD + 1):
        if 2 * p > n:
            break
        if all(layouts[i] == layouts[i + p] for i in range(n - p)):
            return p
    return 1


SLOTS = DefaultSlots()
