"""A stand-in for an RDMA device that refuses what the hardware refuses, for CPU tests only (docs/rdma.md).

It is not an RDMA path, and nothing outside tests uses it. A test process
calls :func:`install` before it makes a ``Context(rdma=...)``. A job's
server and workers can start through ``python -m byteps.testkit.verbs_stand_in
-m MODULE ...``, which installs it and then runs the module.

Bytes really move between processes, without a NIC: registered memory that
a peer may write is a memfd, and an "RDMA WRITE" maps the peer's memfd
through ``/proc/<pid>/fd/<rkey>`` and copies into it. The rules a provider
enforces are enforced here too, so that an endpoint which leans on a
kinder stand-in fails its tests:

- **Addresses are addresses.** A region's address is where the process
  mapped it, and a write names the peer's address, checked against the
  region the rkey names (a remote access error outside it).
- **Queue pairs have states.** One is made in INIT; ``connect`` takes it
  through RTR to RTS. Posting on a queue pair that is not in RTS is
  refused, and a write to a peer whose queue pair is not yet in RTR (or is
  gone) completes with a retry error and breaks the writer's queue pair;
  later work on it is flushed with errors.
- **Inline is limited.** An inline write of more than ``max_inline_data``
  bytes (64 by default, as the transport once asked for) is refused at post.
- **Completions come later.** A post only queues the work. An engine thread
  carries it out afterwards, and nothing is placed before that. Its order
  across queue pairs is shuffled (per queue pair it is the posted order, as
  on a reliable connection), so completions reach a shared completion
  queue in an order a careless reader would not assume. :meth:`StandInDevice.hold`
  stops the engine while a test looks.
- **Queues are finite.** A send queue holds ``max_send_wr`` work requests
  until a signaled completion covering them is polled, then refuses more;
  a completion queue of ``cq_entries`` that is not polled overruns, and
  every queue pair on it breaks.

The completion queue is a :class:`byteps.transport.verbs.CompletionRing`:
memory the engine writes entries into, as a NIC does, and the transport
reads and waits on without the GIL.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import json
import mmap
import os
import random
import runpy
import struct
import sys
import threading
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Tuple

from byteps.transport import verbs
from byteps.transport.errors import NodeFailure

__all__ = ["Rules", "StandInDevice", "StandInQueuePair", "VerbsError", "install", "made"]

#: every device made since install(), for a test's checks
made: List[StandInDevice] = []

RESET, INIT, RTR, RTS, ERROR = range(5)
STATE_NAMES = ("RESET", "INIT", "RTR", "RTS", "ERROR")
#: work completion statuses, as ibv_wc_status numbers them
WC_SUCCESS, WC_FLUSH_ERR, WC_REM_ACCESS_ERR, WC_RETRY_EXC_ERR = 0, 5, 10, 12
_STATUS_TEXT = {WC_FLUSH_ERR: "IBV_WC_WR_FLUSH_ERR: the queue pair broke before this ran",
                WC_REM_ACCESS_ERR: "IBV_WC_REM_ACCESS_ERR: outside the peer's region",
                WC_RETRY_EXC_ERR: "IBV_WC_RETRY_EXC_ERR: the peer is gone or its queue pair is not ready to receive"}
#: the first bytes of a region's memfd: magic, the address the owner mapped its bytes at, their size
_REGION = struct.Struct("<8sQQ")
_REGION_MAGIC = b"BPSMRv1\0"
_REGION_HEADER = 64


@dataclasses.dataclass
class Rules:
    """What the stand-in's provider allows; :func:`install` takes them as keywords."""

    max_inline_data: int = 64
    max_send_wr: int = 1024
    cq_entries: int = 4096
    order: str = "shuffle"  # across queue pairs: "shuffle" (seeded), "reverse" (newest queue pair first), "posted"
    seed: int = 0


class VerbsError(OSError):
    """A post the provider refuses, as ibv_post_send's errno."""


class _Work(NamedTuple):
    wr_id: int
    source: verbs.MemoryRegion
    offset: int
    nbytes: int
    remote_address: int
    rkey: int
    signaled: bool
    inline: Optional[bytes]  # inline data is taken at post time


class StandInQueuePair(verbs.QueuePair):
    """A reliable-connected queue pair with the states, limits and deferred work described above."""

    def __init__(self, device: StandInDevice, number: int) -> None:
        self.device, self.number = device, number
        self.max_inline_data = device.rules.max_inline_data
        # the state lives in a memfd of its own, so that a peer's engine can see whether this side may receive
        self._state_fd = os.memfd_create("byteps-stand-in-qp")
        os.ftruncate(self._state_fd, 1)
        self._state = mmap.mmap(self._state_fd, 1)
        self.state = INIT  # made, then taken to INIT at once, as the transport's pyverbs queue pair is
        self.peer_pid: Optional[int] = None
        self.peer_state: Optional[mmap.mmap] = None
        self.peer = "the peer"
        self.pending: List[_Work] = []  # posted, not yet carried out
        self.outstanding = 0  # send queue slots in use: freed when a signaled completion covering them is polled
        self.unsignaled = 0  # carried out since the last completion of this queue pair
        self._mapped: Dict[int, Tuple[mmap.mmap, int, int]] = {}  # rkey -> (mapping, address, bytes)
        self.writes = 0

    @property
    def state(self) -> int:
        return self._state[0]

    @state.setter
    def state(self, value: int) -> None:
        self._state[0] = value

    def info(self) -> bytes:
        return json.dumps({"stand_in": True, "pid": os.getpid(), "state_fd": self._state_fd,
                           "qpn": self.number}).encode()

    def connect(self, peer: bytes) -> None:
        fields = json.loads(peer)
        if not fields.get("stand_in"):
            raise ValueError("a real queue pair's info reached the stand-in")
        if self.state != INIT:
            raise VerbsError(errno.EINVAL, f"modify_qp to RTR from {STATE_NAMES[self.state]}: only from INIT")
        self.peer_pid = int(fields["pid"])
        self.peer = f"queue pair {fields['qpn']} (pid {self.peer_pid}, stand-in)"
        try:
            fd = os.open(f"/proc/{self.peer_pid}/fd/{int(fields['state_fd'])}", os.O_RDONLY)
            try:
                self.peer_state = mmap.mmap(fd, 1, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
        except OSError as exc:
            raise NodeFailure(f"connecting to {self.peer} failed ({exc.strerror})") from None
        self.state = RTR
        self.state = RTS

    def post(self, source: verbs.MemoryRegion, offset: int, nbytes: int, remote_address: int, rkey: int, *,
             signaled: bool = True, inline: bool = False) -> int:
        """Queue one RDMA WRITE (the engine carries it out later); its work request id. Refusals: VerbsError."""
        device = self.device
        wr_id = device.completions.next_id()  # before the device's lock: a waiter takes them the other way round
        with device.cond:
            if self.state != RTS:
                raise VerbsError(errno.EINVAL, f"post_send on a queue pair in {STATE_NAMES[self.state]}: a queue "
                                 "pair sends only in RTS (INIT -> RTR -> RTS)")
            if inline and nbytes > self.max_inline_data:
                raise VerbsError(errno.EINVAL, f"an inline write of {nbytes} bytes: max_inline_data is "
                                 f"{self.max_inline_data}")
            if self.outstanding >= device.rules.max_send_wr:
                raise VerbsError(errno.ENOMEM, f"the send queue is full ({self.outstanding} work requests): slots "
                                 "come back only when a signaled completion covering them is polled")
            if not inline and source.lkey not in device.lkeys:
                raise VerbsError(errno.EINVAL, "the source is not memory registered with this device")
            data = bytes(source.view[offset:offset + nbytes]) if inline else None
            self.outstanding += 1
            self.pending.append(_Work(wr_id, source, offset, nbytes, remote_address, rkey, signaled, data))
            device.cond.notify()
        return wr_id

    def write(self, source: verbs.MemoryRegion, offset: int, nbytes: int, remote_address: int, rkey: int) -> None:
        try:
            wr_id = self.post(source, offset, nbytes, remote_address, rkey)
        except VerbsError as exc:
            raise NodeFailure(f"RDMA write to {self.peer} could not be posted ({exc.strerror})") from None
        self.device.completions.wait(wr_id, self.peer)

    # --- the engine's side -------------------------------------------------------------
    def _target(self, rkey: int) -> Tuple[mmap.mmap, int, int]:
        found = self._mapped.get(rkey)
        if found is None:
            fd = os.open(f"/proc/{self.peer_pid}/fd/{rkey}", os.O_RDWR)
            try:
                mapping = mmap.mmap(fd, 0)
            finally:
                os.close(fd)
            magic, address, nbytes = _REGION.unpack_from(mapping)
            if magic != _REGION_MAGIC:
                mapping.close()
                raise ValueError("the rkey names no region")
            found = self._mapped[rkey] = (mapping, address, nbytes)
        return found

    def carry_out(self, work: _Work) -> int:
        """Place one write into the peer's memory; its completion status."""
        if self.state != RTS:
            return WC_FLUSH_ERR
        if self.peer_pid is None or not os.path.exists(f"/proc/{self.peer_pid}") or self.peer_state is None \
                or self.peer_state[0] not in (RTR, RTS):
            return WC_RETRY_EXC_ERR
        try:
            mapping, address, nbytes = self._target(work.rkey)
        except OSError:
            return WC_RETRY_EXC_ERR
        except ValueError:
            return WC_REM_ACCESS_ERR
        start = work.remote_address - address
        if start < 0 or start + work.nbytes > nbytes:
            return WC_REM_ACCESS_ERR
        data = work.inline if work.inline is not None else work.source.view[work.offset:work.offset + work.nbytes]
        mapping[_REGION_HEADER + start:_REGION_HEADER + start + work.nbytes] = data
        self.writes += 1
        self.device.bytes_written += work.nbytes
        return WC_SUCCESS

    def close(self) -> None:
        self.state = RESET  # a peer's later writes find no queue pair to receive them
        for mapping, _, _ in self._mapped.values():
            mapping.close()
        self._mapped.clear()


class StandInDevice(verbs.Device):
    """Registered memory as memfds, writes carried out later by an engine thread (see the module's text)."""

    name = "stand-in"

    def __init__(self, interface: Optional[str], gid_index: int, rules: Optional[Rules] = None) -> None:
        self.interface, self.gid_index = interface, gid_index
        self.rules = rules or Rules()
        self.queue_pairs: List[StandInQueuePair] = []
        self.bytes_written = 0
        self.registrations = 0  # caller's buffers registered (register())
        self.lkeys: set = set()
        self._regions: List[Any] = []
        self.ring = verbs.CompletionRing(self.rules.cq_entries)
        self.completions = verbs.Completions(self._poll, self.ring.idle)
        self.cond = threading.Condition(threading.RLock())
        self._held = False
        self._closed = False
        self._random = random.Random(self.rules.seed)
        self._engine = threading.Thread(target=self._run, name="verbs-stand-in-engine", daemon=True)
        self._engine.start()

    # --- memory --------------------------------------------------------------------------
    def allocate(self, nbytes: int) -> verbs.MemoryRegion:
        fd = os.memfd_create("byteps-stand-in-mr")
        os.ftruncate(fd, _REGION_HEADER + max(1, nbytes))
        mapping = mmap.mmap(fd, _REGION_HEADER + max(1, nbytes))
        address = ctypes.addressof(ctypes.c_char.from_buffer(mapping, _REGION_HEADER))
        _REGION.pack_into(mapping, 0, _REGION_MAGIC, address, nbytes)
        self._regions.append((fd, mapping))
        self.lkeys.add(fd)
        view = memoryview(mapping)[_REGION_HEADER:_REGION_HEADER + nbytes]
        return verbs.MemoryRegion(address, nbytes, fd, fd, view, None)

    def register(self, buffer: Any) -> verbs.MemoryRegion:
        view = memoryview(buffer).cast("B")
        if view.readonly:  # as PyverbsDevice: registered memory must be writable, so a copy of our own
            region = self.allocate(view.nbytes)
            region.view[:] = view
            return region
        self.registrations += 1
        lkey = -self.registrations  # never a memfd's number
        self.lkeys.add(lkey)
        address = ctypes.addressof(ctypes.c_char.from_buffer(view))
        return verbs.MemoryRegion(address, view.nbytes, lkey, 0, view, _Registration(self, lkey))

    def queue_pair(self) -> StandInQueuePair:
        with self.cond:
            pair = StandInQueuePair(self, len(self.queue_pairs) + 1)
            self.queue_pairs.append(pair)
        return pair

    # --- completions -----------------------------------------------------------------------
    def _poll(self) -> List[Tuple[int, Optional[str]]]:
        found = []
        for wr_id, status, number, covers in self.ring.poll():
            pair = self.queue_pairs[number - 1]
            with self.cond:
                pair.outstanding -= covers
            found.append((wr_id, None if status == WC_SUCCESS else _STATUS_TEXT.get(status, f"status {status}")))
        return found

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """The engine carries out nothing inside this block: posted work stays unplaced and uncompleted."""
        with self.cond:
            self._held = True
        try:
            yield
        finally:
            with self.cond:
                self._held = False
                self.cond.notify()

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self._closed and (self._held or not any(p.pending for p in self.queue_pairs)):
                    self.cond.wait()
                if self._closed:
                    return
                pairs = [p for p in self.queue_pairs if p.pending]
                if self.rules.order == "shuffle":
                    self._random.shuffle(pairs)
                elif self.rules.order == "reverse":
                    pairs.reverse()
                batch = [(pair, pair.pending) for pair in pairs]
                for pair in pairs:
                    pair.pending = []
            for pair, works in batch:
                while works:
                    work = works.pop(0)
                    status, wr_id, signaled = pair.carry_out(work), work.wr_id, work.signaled
                    # the poster holds the source until its completion: let go of it first, so that the last
                    # reference (and a payload view's page-freeing finalizer, which waits) is never dropped here
                    del work
                    self._complete(pair, wr_id, signaled, status)
            del batch

    def _complete(self, pair: StandInQueuePair, wr_id: int, signaled: bool, status: int) -> None:
        if status != WC_SUCCESS:
            pair.state = ERROR  # as on hardware: a failed work request breaks its queue pair
        if not signaled and status == WC_SUCCESS:
            pair.unsignaled += 1  # no completion: its slot comes back with a later signaled one
            return
        covers, pair.unsignaled = pair.unsignaled + 1, 0
        if not self.ring.push(wr_id, status, pair.number, covers):
            for every in self.queue_pairs:  # an overrun completion queue breaks every queue pair on it
                every.state = ERROR

    def close(self) -> None:
        with self.cond:
            self._closed = True
            self.cond.notify()
        for pair in self.queue_pairs:
            pair.close()


class _Registration:
    """What MemoryRegion.close deregisters."""

    def __init__(self, device: StandInDevice, lkey: int) -> None:
        self.device, self.lkey = device, lkey

    def close(self) -> None:
        self.device.lkeys.discard(self.lkey)


def install(**rules: Any) -> List[StandInDevice]:
    """Every later RDMA device of this process is a stand-in with these :class:`Rules`; returns :data:`made`."""
    chosen = Rules(**rules)

    def opener(interface: Optional[str], gid_index: int) -> StandInDevice:
        device = StandInDevice(interface, gid_index, chosen)
        made.append(device)
        return device

    verbs.use_device(opener)
    return made


if __name__ == "__main__":  # python -m byteps.testkit.verbs_stand_in -m MODULE ARGS... | SCRIPT ARGS...
    install()
    arguments = sys.argv[1:]
    if arguments and arguments[0] == "-m":
        sys.argv = arguments[1:]
        runpy.run_module(arguments[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = arguments
        runpy.run_path(arguments[0], run_name="__main__")
