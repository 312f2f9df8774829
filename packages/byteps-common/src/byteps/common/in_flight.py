"""Names whose operation is in flight: reserved when submitted, released when done.

One rule, kept here once and used at three levels: the worker's tensors
(a push_pull of a name still in flight), the adapters' op names (an
allreduce or allgather of a name still in flight, :mod:`byteps.common.frontend.names`)
and grouped calls (:mod:`byteps.common.fusion`). Submitting a name again
before its operation is done is a ValueError raised before anything is
sent, since the second operation would overwrite buffers the first still
reads, or pair up with the other ranks' first one. A few names may instead
be waited for (an unnamed op's default name, reused after a window of
others: its earlier op is ahead in every rank's order, so it finishes).

Example::

    names = NamesInFlight()
    token = names.reserve(["grad"], lambda name: f"{name!r} is still in flight")
    names.release("grad", token)
"""

from __future__ import annotations

import threading
from typing import Callable, Collection, Dict, Optional, Sequence

__all__ = ["NamesInFlight"]


class NamesInFlight:
    """A thread-safe set of names in flight, each with the token of the operation that holds it."""

    def __init__(self) -> None:
        self._released = threading.Condition()
        self._busy: Dict[str, object] = {}

    def reserve(self, names: Sequence[str], refusal: Callable[[str], str], wait_for: Collection[str] = ()) -> object:
        """Mark every name of ``names`` in flight, or none: a name in flight is waited for if it is in
        ``wait_for``, else ValueError(``refusal(name)``). Returns the token that releases them."""
        with self._released:
            for name in names:
                if name in wait_for:
                    self._released.wait_for(lambda name=name: name not in self._busy)
            busy = next((name for name in names if name in self._busy), None)
            if busy is not None:
                raise ValueError(refusal(busy))
            token = object()
            for name in names:
                self._busy[name] = token
            return token

    def release(self, name: str, token: Optional[object] = None) -> None:
        """Free ``name`` (only if ``token`` still holds it, when given: a late release of an earlier op)."""
        with self._released:
            if name in self._busy and (token is None or self._busy[name] is token):
                del self._busy[name]
                self._released.notify_all()

    def wait_free(self, name: str) -> None:
        """Return once ``name`` is not in flight."""
        with self._released:
            self._released.wait_for(lambda: name not in self._busy)

    def clear(self) -> None:
        with self._released:
            self._busy.clear()
            self._released.notify_all()

    def __contains__(self, name: str) -> bool:
        with self._released:
            return name in self._busy
