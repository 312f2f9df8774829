"""Which partition goes on the wire next: priority order within a credit.

BytePS's scheduling, on the worker: partitions wait in a priority queue and
are pushed while the bytes in flight stay within the credit
(``BYTEPS_SCHEDULING_CREDIT`` partitions of ``BYTEPS_PARTITION_BYTES``).
Partitions of tensors declared earlier (closer to the model's input, needed
first by the next forward pass) go first; within a tensor, lower partitions
first; among equals, the order of arrival.

The credit is returned when the server acknowledges the *push* (PUSH_ACK),
not when the sum comes back: a sum also waits for the other workers, and a
credit held across workers could deadlock two workers whose tensors became
ready in different orders. Keeping the transport's send queue short is what lets a
late, urgent partition overtake the bulk of an earlier, larger tensor.

Example::

    queue = CreditQueue(credit_bytes=8 << 20)
    queue.add(priority=(tensor_id, index), nbytes=4 << 20, item=work)
    for work in queue.sendable():    # as many as the credit allows
        send(work)
    queue.release(4 << 20)           # on PUSH_ACK
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Callable, Iterator, List, Tuple

__all__ = ["CreditQueue"]


class CreditQueue:
    """A priority queue of pending sends, drained within a byte credit (0 = unbounded)."""

    def __init__(self, credit_bytes: int) -> None:
        if credit_bytes < 0:
            raise ValueError(f"credit_bytes must be >= 0, got {credit_bytes}")
        self.credit_bytes = credit_bytes
        self.in_flight_bytes = 0
        self._heap: List[Tuple[Tuple[int, ...], int, int, Any]] = []
        self._arrival = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, priority: Tuple[int, ...], nbytes: int, item: Any) -> None:
        """Queue ``item`` of ``nbytes``; smaller ``priority`` tuples go first."""
        heapq.heappush(self._heap, (priority, next(self._arrival), nbytes, item))

    def sendable(self) -> Iterator[Any]:
        """Pop items in priority order while they fit in the credit.

        The first item always goes when nothing is in flight, so a partition
        larger than the whole credit still moves (alone).
        """
        while self._heap:
            nbytes = self._heap[0][2]
            unbounded = self.credit_bytes == 0
            if not unbounded and self.in_flight_bytes and self.in_flight_bytes + nbytes > self.credit_bytes:
                return
            _, _, nbytes, item = heapq.heappop(self._heap)
            self.in_flight_bytes += nbytes
            yield item

    def release(self, nbytes: int) -> None:
        """A sent item of ``nbytes`` has arrived: its bytes leave the credit."""
        self.in_flight_bytes = max(0, self.in_flight_bytes - nbytes)

    def discard(self, unwanted: Callable[[Any], bool]) -> None:
        """Remove the queued items for which ``unwanted(item)`` is true (a failed task's); order is kept."""
        self._heap = [entry for entry in self._heap if not unwanted(entry[3])]
        heapq.heapify(self._heap)
