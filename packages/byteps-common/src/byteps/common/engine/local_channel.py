"""The control channel between the worker processes of one machine.

Each local rank listens at ``ipc://@byteps-<job>-m<machine>-l<rank>`` (Linux's
abstract Unix-socket namespace: nothing on disk to clean up) and connects
to every other rank's listener; messages are byteps frames through the
transport's endpoints like every other message of the job. Since any process
on the host can reach an abstract socket, a job with a secret
(BYTEPS_JOB_SECRET; bpslaunch makes one) authenticates these connections
too: each rank proves the secret to every peer's listener, and a listener
acts only on messages from connections that proved it. A stranger's forged
LOCAL_DONE, which could otherwise make a rank read a half-summed buffer, is
refused and logged.

The handshakes run when the channel opens, while the rank keeps answering
its own listener, since its peers are authenticating to it at the same
time; a message that a faster peer sends meanwhile is kept for
:meth:`LocalChannel.receive`.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Deque, Dict, Optional

from byteps.transport import (
    AuthenticationError,
    ClientHandshake,
    Context,
    Endpoint,
    Gate,
    Message,
    Poller,
)

__all__ = ["LocalChannel", "MAX_PAYLOAD_BYTES", "local_address"]

log = logging.getLogger("byteps.common.engine.local_channel")
_LINGER_MS = 2000  # an ERROR sent just before this process exits must still reach the peers
#: The largest payload of one message between local ranks (the channel's endpoints are opened with it).
MAX_PAYLOAD_BYTES = 1 << 20


def local_address(job_id: str, machine: int, local_rank: int) -> str:
    return f"ipc://@byteps-{job_id}-m{machine}-l{local_rank}"


class LocalChannel:
    """This rank's listener (its inbox) and its connections to the other local ranks."""

    def __init__(self, context: Context, job_id: str, machine: int, local_rank: int, local_size: int,
                 secret: Optional[bytes], timeout_s: float) -> None:
        self.local_rank = local_rank
        self.inbox: Endpoint = context.listen(local_address(job_id, machine, local_rank), MAX_PAYLOAD_BYTES)
        self.gate = Gate(secret, local_rank, log)
        self._early: Deque[Message] = collections.deque()
        self.peers: Dict[int, Endpoint] = {
            rank: context.connect(local_address(job_id, machine, rank), MAX_PAYLOAD_BYTES)
            for rank in range(local_size) if rank != local_rank}
        if secret is not None:
            self._authenticate(secret, timeout_s)

    def _authenticate(self, secret: bytes, timeout_s: float) -> None:
        handshakes = {rank: ClientHandshake(peer, secret, self.local_rank) for rank, peer in self.peers.items()}
        poller = Poller()
        poller.register(self.inbox)
        owners = {}
        for rank, handshake in handshakes.items():
            handshake.start()
            poller.register(handshake.connection)
            owners[id(handshake.connection)] = rank
        deadline = time.monotonic() + timeout_s
        # Both ways: this rank's proofs to every peer, and every peer's proof to this rank. A rank that only
        # waited for its own would stop answering here, and a peer it left behind could wait forever if
        # this rank then shut down before its comm thread answered.
        while any(not h.done for h in handshakes.values()) or self.gate.admitted < len(self.peers):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                waiting = sorted(rank for rank, h in handshakes.items() if not h.done)
                raise AuthenticationError(
                    f"local rank {self.local_rank}: local ranks {waiting} did not complete the handshake "
                    f"({self.gate.admitted} of {len(self.peers)} proved themselves here) within {timeout_s:g} s "
                    "(BYTEPS_RENDEZVOUS_TIMEOUT)")
            for ready in poller.poll(remaining):
                if ready is self.inbox:
                    message = self._admitted()
                    if message is not None:
                        self._early.append(message)
                else:
                    handshakes[owners[id(ready)]].step(ready.recv())

    def _admitted(self) -> Optional[Message]:
        message = self.inbox.recv_or_refuse(self.local_rank, log)
        if message is None or not self.gate.admit(self.inbox, message):
            return None
        return message

    def receive(self) -> Optional[Message]:
        """The next admitted message from a peer, or None (a handshake step, a refused stranger)."""
        if self._early:
            return self._early.popleft()
        return self._admitted()

    @property
    def has_early(self) -> bool:
        return bool(self._early)

    def send(self, rank: int, command: int, key: int, round_: int, nbytes: int = 0, dtype: int = 0,
             flags: int = 0, payload: Optional[bytes] = None) -> None:
        """One message to local rank ``rank``; the partition's size travels in ``aux``."""
        self.peers[rank].send(command, self.local_rank, key, round_, payload=payload, dtype=dtype, flags=flags,
                              aux=nbytes)

    def close(self) -> None:
        for peer in self.peers.values():
            peer.close(_LINGER_MS)
        self.inbox.close(0)
