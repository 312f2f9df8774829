"""Tensor names as users give them, and the byteps tensors behind them.

Three rules every adapter follows, kept here once:

* ``name=None`` becomes ``"<op>.noname.<slot>"``, one of
  :data:`DEFAULT_NAME_WINDOW` slots per op family, chosen alike on every
  rank that issues and synchronizes the same ops in the same order
  (:mod:`~byteps.common.frontend.default_slots`): blocking calls of one
  shape reuse one name, a repeating pattern of shapes settles on a name
  per shape, and unnamed ops never use more than the window's names.
* byteps fixes a tensor name's size and dtype at first use, while Horovod
  lets a name be reused with another shape (a smaller last batch, two
  models with the same parameter names). The first layout keeps the name,
  later ones become ``"<name>#<k>"`` in order of first use, the same on
  every rank that issues the same ops. (After ``join()`` the ranks agree on
  both again, :func:`join_state`: a rank that joined early missed some.)
* A rank that uses a name with another layout than at its last use first
  announces the switch on the last use's tensor
  (:meth:`byteps.common.Worker.announce_layout`), where the other ranks
  meet it: if they go on with the old layout, or switch to another one,
  the round fails on every rank, naming both, where each rank would
  otherwise wait on a tensor of its own for ever. A refused switch is
  forgotten, so the ranks still agree on the name's layouts afterwards.
  So is a layout whose tensor's first round failed on every rank (ranks
  that used the name with different shapes at once: each added its own
  layout): :func:`forget_retired`, when the core retires the tensor.
* A name may not be submitted again while an op of it is in flight
  (:meth:`TensorNames.reserve`); a user's name stays in flight until its
  handle is synchronized, a default name until its op is done.

Example::

    names = TensorNames()
    name = names.resolve("allreduce", None)          # "allreduce.noname.0"
    key = names.key(name, ((3,), "float32"))         # "allreduce.noname.0"
    token = names.reserve(name, "allreduce('x')")
    names.release(name, token)
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Hashable, List, Optional, Tuple

from byteps.common.frontend.default_slots import SLOTS
from byteps.common.frontend.default_slots import WINDOW as DEFAULT_NAME_WINDOW
from byteps.common.in_flight import NamesInFlight

__all__ = ["TensorNames", "check_name", "DEFAULT_NAME_WINDOW", "join_state", "adopt_join_states", "forget_retired"]

_instances_lock = threading.Lock()
_instances: List[TensorNames] = []  # every TensorNames, in creation order (the same on every rank)
#: (op family, slot, op number): an unnamed op's default slot (default_slots)
_Claim = Tuple[str, int, int]


def join_state() -> Dict[str, Any]:
    """What ranks agree on again after a join: the unnamed-op counters and every adapter's layouts."""
    with _instances_lock:
        instances = list(_instances)
    return {"counters": SLOTS.counters(), "layouts": [names.layouts() for names in instances]}


def adopt_join_states(states: List[Dict[str, Any]]) -> None:
    """Take every rank's :func:`join_state` and continue from the furthest: the largest counters, and per
    name the longest layout list (ranks see a name's layouts in one order, so each list extends the others).
    No layout is in use afterwards: a rank that joined early has not pushed the tensors of the others' last
    uses, so it could not announce a switch on them; each name's next use starts afresh on every rank. The
    default slots start afresh too (:meth:`~byteps.common.frontend.default_slots.DefaultSlots.restart`)."""
    counters: Dict[str, int] = {}
    for state in states:
        for family, count in state["counters"].items():
            counters[family] = max(counters.get(family, 0), count)
    SLOTS.restart(counters)
    with _instances_lock:
        instances = list(_instances)
    for index, names in enumerate(instances):
        longest: Dict[str, List[str]] = {}
        for state in states:
            for name, seen in (state["layouts"][index] if index < len(state["layouts"]) else {}).items():
                if len(seen) > len(longest.get(name, ())):
                    longest[name] = seen
        names.adopt_layouts(longest)


def forget_retired(tensor_name: str) -> None:
    """The core retired ``tensor_name`` (its first round failed on every rank,
    :meth:`~byteps.common.tensor_registry.TensorRegistry.first_round_failed`): every adapter forgets the layout
    it stood for, and that any layout of the name is in use, as every rank does; the name's next use then
    numbers its layout as the others do and announces nothing."""
    name, scope = tensor_name, 0
    if name.endswith(")") and " (process set " in name:
        name, _, number = name[:-1].rpartition(" (process set ")
        scope = int(number) if number.isdigit() else 0
    name = name.removesuffix(" (every machine)")  # backup workers' tensor of the name's other ops
    base, mark, variant = name.rpartition("#")
    index = int(variant) if mark and variant.isdigit() else 0
    with _instances_lock:
        instances = list(_instances)
    for names in instances:
        names.forget_layout(base if index else name, index, scope)


def check_name(family: str, name: Any) -> str:
    """``name`` if it is a non-empty string, else a ValueError naming the op family."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{family}: a name must be a non-empty string, got {name!r}")
    return name


class TensorNames:
    """Default names, per-layout byteps names and names in flight, of one adapter (thread-safe).

    ``settle(key)``, where given, returns once every op the adapter issued on
    the byteps tensor ``key`` has started (an adapter whose ops start later
    than issued, on an engine of its own): a layout switch is announced
    after them.
    """

    def __init__(self, settle: Optional[Callable[[str], None]] = None) -> None:
        self._lock = threading.Lock()
        self._settle = settle
        self._defaults: set = set()  # the default names handed out (at most DEFAULT_NAME_WINDOW per family)
        self._claims: Dict[str, _Claim] = {}  # default name -> its op's slot, until reserve()
        self._unrecorded: Dict[str, _Claim] = {}  # default name -> its op, until key() records its layout
        self._slots: Dict[object, _Claim] = {}  # reserve() token -> the slot its op holds
        self._slot_tokens: Dict[Tuple[str, int], object] = {}  # (family, slot) -> the token of its latest op
        self._layouts: Dict[str, List[str]] = {}  # name -> repr() of each layout, in order of first use
        self._current: Dict[Tuple[str, int], int] = {}  # (name, process set id) -> index of the layout in use there
        self._busy = NamesInFlight()  # names of the ops in flight
        with _instances_lock:
            _instances.append(self)

    def default(self, family: str) -> str:
        """``"<family>.noname.<slot>"``, the slot :mod:`~byteps.common.frontend.default_slots` gives the op; the
        op holds it until :meth:`free_slot`."""
        slot, op = SLOTS.take(family)
        name = f"{family}.noname.{slot}"
        with self._lock:
            self._defaults.add(name)
            self._claims[name] = self._unrecorded[name] = (family, slot, op)
        return name

    def free_slot(self, name: str, token: object = None, refused: bool = False) -> None:
        """The caller is done with the unnamed op of ``name`` reserved with ``token`` (``token`` None: not
        reserved): its handle synchronized, or the call ``refused`` (taken back as if never made). Only at
        points of the program's order, the same on every rank. Nothing for a user's name."""
        with self._lock:
            claim = self._slots.pop(token, None) if token is not None else self._claims.pop(name, None)
            if claim is None:
                return
            family, slot, _ = claim
            if token is not None and self._slot_tokens.get((family, slot)) is token:
                del self._slot_tokens[(family, slot)]
            if self._unrecorded.get(name) == claim:
                del self._unrecorded[name]
        SLOTS.free(*claim, taken_back=refused)

    def resolve(self, family: str, name: Optional[str]) -> str:
        """The user's name (checked), or the next default name of ``family``."""
        return self.default(family) if name is None else check_name(family, name)

    def key(self, name: str, layout: Hashable, scope: int = 0) -> str:
        """The byteps tensor name of ``name`` used with ``layout`` (e.g. ``(shape, dtype)``) in the process set
        ``scope`` (its id; 0: every rank). A switch from the layout of the name's last use in that set is
        announced first (see the module doc); raises if the set's other ranks do not make the same switch."""
        layout = repr(layout)
        with self._lock:
            unrecorded = self._unrecorded.pop(name, None)
            seen = self._layouts.setdefault(name, [])
            added = layout not in seen
            if added:
                seen.append(layout)
            index = seen.index(layout)
            before = self._current.setdefault((name, scope), index)
        if before != index:
            previous = _layout_key(name, before)
            try:
                if self._settle is not None:
                    self._settle(previous)
                from byteps.common import api  # noqa: PLC0415 -- the front is imported by the api

                api.worker().announce_layout(previous, layout, scope)
            except BaseException:
                if added:
                    with self._lock:
                        if seen and seen[-1] == layout:
                            seen.pop()  # the others never saw it: a later use numbers it as they do
                raise
            with self._lock:
                self._current[(name, scope)] = index
        if unrecorded is not None:
            family, _, op = unrecorded
            SLOTS.record(family, op, layout)
        return _layout_key(name, index)

    def layouts(self) -> Dict[str, List[str]]:
        with self._lock:
            return {name: list(seen) for name, seen in self._layouts.items()}

    def adopt_layouts(self, layouts: Dict[str, List[str]]) -> None:
        """Layout lists that extend this one's (after a join), replacing it; no layout is in use afterwards
        (see :func:`adopt_join_states`)."""
        with self._lock:
            for name, seen in layouts.items():
                if len(seen) > len(self._layouts.get(name, ())):
                    self._layouts[name] = list(seen)
            self._current.clear()

    def forget_layout(self, name: str, index: int, scope: int) -> None:
        """Forget layout ``index`` of ``name`` if it is the last one added (its first round failed), and which
        layout of the name is in use in process set ``scope``."""
        with self._lock:
            seen = self._layouts.get(name)
            if seen is None or index != len(seen) - 1:
                return
            seen.pop()
            if not seen:
                del self._layouts[name]
            self._current.pop((name, scope), None)

    def reserve(self, name: str, what: str) -> object:
        """Mark ``name`` in flight; returns the token that releases it.

        A default name still in flight is waited for (its earlier op is
        ahead in every rank's order, so it finishes); a user's name in
        flight is an error.
        """
        with self._lock:
            waits = name in self._defaults
        token = self._busy.reserve([name], lambda _: f"{what}: an op of this name is still in flight; synchronize() "
                                   "its handle before submitting the name again", (name,) if waits else ())
        with self._lock:
            claim = self._claims.pop(name, None)
            if claim is not None:
                family, slot, _ = claim
                self._slots.pop(self._slot_tokens.get((family, slot)), None)  # an op whose slot this one took
                self._slots[token] = self._slot_tokens[(family, slot)] = claim
        return token

    def is_default(self, name: str) -> bool:
        """Whether ``name`` is a default name handed out by :meth:`default`."""
        with self._lock:
            return name in self._defaults

    def release(self, name: str, token: object) -> None:
        """Free ``name`` unless a later op holds it already (a late done-callback of an earlier one)."""
        self._busy.release(name, token)

    def forget(self) -> None:
        """Forget names in flight (at shutdown). Layouts stay, and the layout in use of each name: a later
        init() resumes the same worker, whose tensors keep their sizes and last uses (see
        :func:`byteps.common.api.suspend`). The slots this adapter's ops held are free."""
        self._busy.clear()
        with self._lock:
            claims = list(self._claims.values()) + list(self._slots.values())
            self._claims.clear()
            self._unrecorded.clear()
            self._slots.clear()
            self._slot_tokens.clear()
        for claim in claims:
            SLOTS.free(*claim)


def _layout_key(name: str, index: int) -> str:
    return name if index == 0 else f"{name}#{index}"
