"""The server's stall inspector (Horovod's, seen from the parameter server).

A round of a key that some workers have pushed and others have not, for
longer than BYTEPS_STALL_CHECK_TIME seconds, is reported once: which tensor,
which round, which worker ranks are missing and which have pushed. With
BYTEPS_STALL_SHUTDOWN_TIME > 0, a round stalled that long ends the job: the
waiting workers get an ERROR naming the missing ranks and the server exits 1.
Partitions of one tensor are reported together.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Dict, Iterable, List, Optional, Set, Tuple

__all__ = ["StallInspector", "Stall", "PartialRound"]

log = logging.getLogger("byteps.server.stall")


@dataclasses.dataclass(frozen=True)
class PartialRound:
    """What the inspector needs to know about one key's round in progress."""

    key: int
    name: str
    round: int
    started: float  # time.monotonic() of the round's first push
    pushed_ranks: Set[int]


@dataclasses.dataclass(frozen=True)
class Stall:
    name: str
    round: int
    seconds: float
    missing: Tuple[int, ...]
    pushed: Tuple[int, ...]
    keys: Tuple[int, ...]
    unit: str = "worker ranks"

    def describe(self) -> str:
        return (f"tensor {self.name!r} round {self.round} stalled for {self.seconds:.0f} s: {self.unit} "
                f"{list(self.missing)} have not pushed it ({self.unit.split()[-1]} {list(self.pushed)} have); "
                "every worker must push_pull the same tensors")


class StallInspector:
    """Finds rounds that wait too long for some workers."""

    def __init__(self, check_s: float, shutdown_s: float, num_workers: int, unit: str = "worker ranks") -> None:
        self.unit = unit  # what the numbers in a report are: worker ranks, or machines under local aggregation
        self.check_s = check_s
        self.shutdown_s = shutdown_s
        self.num_workers = num_workers
        self._reported: Set[Tuple[str, int]] = set()

    @property
    def enabled(self) -> bool:
        return self.check_s > 0 or self.shutdown_s > 0

    def inspect(self, rounds: Iterable[PartialRound], now: Optional[float] = None) -> List[Stall]:
        """Log newly stalled tensors; return those stalled past the shutdown time."""
        now = time.monotonic() if now is None else now
        grouped: Dict[Tuple[str, int], List[PartialRound]] = {}
        for partial in rounds:
            grouped.setdefault((partial.name, partial.round), []).append(partial)
        fatal = []
        for (name, round_), parts in grouped.items():
            seconds = now - min(p.started for p in parts)
            pushed = set.intersection(*(p.pushed_ranks for p in parts))
            stall = Stall(name, round_, seconds, tuple(sorted(set(range(self.num_workers)) - pushed)),
                          tuple(sorted(pushed)), tuple(sorted(p.key for p in parts)), self.unit)
            if self.check_s > 0 and seconds >= self.check_s and (name, round_) not in self._reported:
                self._reported.add((name, round_))
                log.warning("stall inspector: %s", stall.describe())
            if self.shutdown_s > 0 and seconds >= self.shutdown_s:
                fatal.append(stall)
        return fatal
