"""What every round policy shares: the key it serves, the server it runs in, and the interface it offers.

The parameter server keeps one :class:`KeyState` per key (one partition of
one tensor): the :class:`~byteps.common.tensor_description.PartitionSpec`
its INIT_KEY declared, which worker connections declared it, and the key's
round policy, the object that decides what a round of the key *is*
(:class:`RoundPolicy`; see :mod:`byteps.server.rounds`). The policies of
one server share one :class:`RoundServices`: the summation engine, the
function that sends a message, the machines that joined, the tracer and
the counters the job's report shows. Unit tests build a ``RoundServices``
over a real engine and a recording ``send`` and drive a policy with no
socket at all.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Dict, Optional, Protocol, Set

from byteps.common.tensor_description import PartitionSpec
from byteps.common.tracing import Tracer
from byteps.server._C import ServerEngine
from byteps.server.rounds.joined import JoinedMachines
from byteps.server.stall_inspector import PartialRound
from byteps.transport import Message

__all__ = ["KeyState", "RoundPolicy", "RoundServices", "wire_log"]

#: One line per PUSH in arrival order, and one per answer, at PS_VERBOSE=2, as ps-lite logged its messages.
wire_log = logging.getLogger("byteps.transport.server_pushes")

#: ``send(command, sender, key, round, payload=None, dtype=0, flags=0, aux=0, identity=None)``: the
#: server listener's :meth:`~byteps.transport.endpoint.Endpoint.send`, or a recording fake in unit tests.
Send = Callable[..., None]


class RoundPolicy(Protocol):
    """What a key's rounds are: how its pushes are taken and its pulls answered.

    The server calls these once it has checked the message (its key was
    declared by this connection, its dtype is the key's, its round was not
    failed by a worker); a policy raises ValueError for a message that
    breaks its rules, and the server answers that with an ERROR.
    """

    def push(self, message: Message) -> None:
        """Take one PUSH; acknowledge it (PUSH_ACK) unless it carries its pull (FLAG_PULL)."""

    def pull(self, message: Message) -> None:
        """Take one PULL: answer it now, or keep it until its round can be answered."""

    def is_waiting(self, identity: bytes, round_: int) -> bool:
        """Whether that connection's pull of that round is kept unanswered (a push that carried it is then
        acknowledged: the answer, which would return the worker's credit, is not on its way)."""

    def machine_joined(self) -> None:
        """A worker machine joined (hvd.join): a round in progress may take its zeros and close."""

    def fail_round(self, round_: int) -> None:
        """A worker failed the round: forget its pending pulls (each was answered with the ERROR)."""

    def partial_round(self) -> Optional[PartialRound]:
        """The round some machines pushed and others not yet, for the stall inspector; None if none."""


@dataclasses.dataclass
class RoundServices:
    """What the round policies of one server share.

    ``joined`` is shared on purpose: a JOIN concerns every key, and each
    policy reads the same set of joined machines. The counters are the
    server's report (``async_pushes``, ``late_pushes``).
    """

    engine: ServerEngine
    send: Send
    rank: int  # the server's rank: the sender of every answer
    num_machines: int  # worker machines: one push per machine and key (local aggregation)
    local_size: int  # worker processes per machine: a worker's machine is its rank // local_size
    joined: JoinedMachines
    tracer: Optional[Tracer] = None
    async_max_staleness: Optional[int] = None  # BYTEPS_ASYNC_MAX_STALENESS
    max_payload_bytes: int = 0  # the most a worker receives in one answer (Config.max_partition_bytes; 0: no limit)
    async_pushes: int = 0  # deltas added to asynchronous keys' stores
    late_pushes: int = 0  # backup workers: pushes for rounds already closed, dropped
    _zeros: Dict[int, memoryview] = dataclasses.field(default_factory=dict, repr=False)

    def zeros(self, nbytes: int) -> memoryview:
        """A read-only block of zeros, one per size: what a push flagged zeros stands for (the engine only
        counts it, and keeps it as the sum of a round of zeros alone)."""
        zeros = self._zeros.get(nbytes)
        if zeros is None:
            zeros = self._zeros[nbytes] = memoryview(bytes(nbytes))
        return zeros


@dataclasses.dataclass
class KeyState:
    """One declared key: its description, who declared it, and its round policy."""

    key: int
    spec: PartitionSpec
    declared_by: Dict[bytes, int] = dataclasses.field(default_factory=dict)  # identity -> worker rank
    refused: Set[bytes] = dataclasses.field(default_factory=set)  # identities whose declaration disagreed
    policy: RoundPolicy = dataclasses.field(init=False, repr=False)  # set by rounds.declare_key

    def rank_of(self, identity: bytes) -> int:
        """The worker rank of a connection that declared this key (-1 for one that did not)."""
        return self.declared_by.get(identity, -1)
