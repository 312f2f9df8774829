"""Drives round policies (byteps.server.rounds) as the server would, without sockets.

The engine is the real ``ServerEngine``; only the listener's ``send`` is
replaced, by :class:`RecordingSender`, which keeps what a policy sends.
Worker rank r talks through identity ``b"rank-r"``; its machine is
``r // local_size``.

Example::

    server = RoundDriver(machines=2)
    server.declare(0, spec_of(4))
    server.push(0, rank=0, round_=0, values=[1, 2, 3, 4])
    server.pull(0, rank=0, round_=0)
    server.push(0, rank=1, round_=0, values=[1, 1, 1, 1])
    server.answers()            # [Sent(PULL_RESPONSE, rank 0, ...)]
"""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Sequence

import numpy as np

from byteps.common.dtypes import DType
from byteps.common.tensor_description import PartitionSpec
from byteps.server.engine import create_engine
from byteps.server.rounds import JoinedMachines, KeyState, RoundServices, declare_key
from byteps.transport import Command, Header, Message


class Sent(NamedTuple):
    command: Command
    to: int  # the worker rank the identity stands for
    key: int
    round: int
    payload: Optional[bytes]  # copied when sent
    aux: int


def identity(rank: int) -> bytes:
    return f"rank-{rank}".encode()


def rank_of(identity_: bytes) -> int:
    return int(identity_.decode().split("-")[1])


class RecordingSender:
    """Stands in for the server listener's ``send``: keeps every message, its payload copied at send time."""

    def __init__(self) -> None:
        self.sent: List[Sent] = []

    def __call__(self, command: int, sender: int, key: int = 0, round: int = 0, payload: Any = None,
                 dtype: int = 0, flags: int = 0, aux: int = 0, identity: Optional[bytes] = None) -> None:
        self.sent.append(Sent(Command(command), rank_of(identity), key, round,
                              None if payload is None else bytes(payload), aux))


def spec_of(count: int, dtype: DType = DType.FLOAT32, name: str = "w", **options: Any) -> PartitionSpec:
    """A one-partition tensor of ``count`` elements."""
    nbytes = count * DType(dtype).itemsize
    return PartitionSpec(name=name, partition=0, shape=(count,), tensor_nbytes=nbytes, nbytes=nbytes,
                         dtype=int(dtype), **options)


class RoundDriver:
    """A server's keys and their policies over a real engine, fed fake messages, with a recording sender."""

    def __init__(self, machines: int, local_size: int = 1, staleness: Optional[int] = None) -> None:
        self.engine = create_engine(1, machines)
        self.sender = RecordingSender()
        self.services = RoundServices(self.engine, self.sender, 0, machines, local_size,
                                      JoinedMachines(machines, local_size), None, staleness)
        self.keys: Dict[int, KeyState] = {}

    def declare(self, key: int, spec: PartitionSpec, ranks: Optional[Sequence[int]] = None) -> Any:
        """INIT_KEY of ``key`` by ``ranks`` (every rank by default); returns the key's policy."""
        state = self.keys[key] = declare_key(key, spec, self.services)
        machines, local = self.services.num_machines, self.services.local_size
        for rank in range(machines * local) if ranks is None else ranks:
            state.declared_by[identity(rank)] = rank
        return state.policy

    def push(self, key: int, rank: int, round_: int, values: Any = None, flags: int = 0, aux: int = 0,
             payload: Any = None) -> None:
        """A PUSH of ``values`` (in the key's dtype) or of raw ``payload`` bytes."""
        spec = self.keys[key].spec
        if payload is None and values is not None:
            payload = np.asarray(values, dtype=DType(spec.dtype).storage).tobytes()
        data = None if payload is None else memoryview(bytes(payload))
        header = Header(Command.PUSH, rank, key, round_, 0 if data is None else data.nbytes, spec.dtype, flags, aux)
        self.keys[key].policy.push(Message(header, data, identity(rank)))

    def pull(self, key: int, rank: int, round_: int, flags: int = 0) -> None:
        header = Header(Command.PULL, rank, key, round_, 0, self.keys[key].spec.dtype, flags, 0)
        self.keys[key].policy.pull(Message(header, None, identity(rank)))

    def join(self, rank: int) -> None:
        """JOIN from worker ``rank``, as the server handles it."""
        if self.services.joined.join(rank):
            for state in self.keys.values():
                state.policy.machine_joined()

    def take(self, command: Optional[Command] = None) -> List[Sent]:
        """What was sent since the last take (only ``command``'s messages, if given); forgets all of it."""
        sent, self.sender.sent = self.sender.sent, []
        return [s for s in sent if command is None or s.command == command]

    def answers(self, dtype: DType = DType.FLOAT32) -> Dict[int, List[float]]:
        """The PULL_RESPONSEs since the last take, as rank -> values (forgets everything sent)."""
        storage = DType(dtype).storage
        return {s.to: None if s.payload is None else np.frombuffer(s.payload, storage).tolist()
                for s in self.take(Command.PULL_RESPONSE)}
