"""A stand-in for an RDMA device, for CPU tests of the RDMA transport's bookkeeping only (docs/rdma.md).

It is not an RDMA path, and nothing outside tests uses it. A test process
calls :func:`install` before it makes a ``Context(rdma=...)``. A job's
server and workers can start through ``python -m byteps.testkit.verbs_stand_in
-m MODULE ...``, which installs it and then runs the module. From then on:

- "registered memory" that a peer may write is a memfd;
- a queue pair's "connect" learns the peer's pid;
- an "RDMA WRITE" maps the peer's memfd through ``/proc/<pid>/fd/<rkey>``
  and copies into it, so bytes really move between processes, without a NIC;
- a write to a peer that is gone fails as a broken queue pair does: a
  ``NodeFailure``.

Addresses of allocated regions are offsets (base 0), and the rkey is the
memfd's descriptor.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import runpy
import sys
from typing import Any, Dict, List, Optional

from byteps.transport import verbs
from byteps.transport.errors import NodeFailure

__all__ = ["StandInDevice", "install", "made"]

#: every device made since install(), for a test's checks
made: List[StandInDevice] = []


class StandInQueuePair(verbs.QueuePair):
    def __init__(self, device: StandInDevice) -> None:
        self.device = device
        self.peer_pid: Optional[int] = None
        self._mapped: Dict[int, mmap.mmap] = {}
        self.writes = 0
        self.small_writes = 0

    def info(self) -> bytes:
        return json.dumps({"stand_in": True, "pid": os.getpid()}).encode()

    def connect(self, peer: bytes) -> None:
        fields = json.loads(peer)
        if not fields.get("stand_in"):
            raise ValueError("a real queue pair's info reached the stand-in")
        self.peer_pid = int(fields["pid"])

    def _target(self, rkey: int) -> mmap.mmap:
        if self.peer_pid is None:
            raise NodeFailure("RDMA write on a queue pair that is not connected")
        target = self._mapped.get(rkey)
        if target is None:
            path = f"/proc/{self.peer_pid}/fd/{rkey}"
            try:
                fd = os.open(path, os.O_RDWR)
            except OSError as exc:
                raise NodeFailure(f"RDMA write to pid {self.peer_pid} failed ({exc.strerror}): the peer is gone "
                                  "(stand-in)") from None
            try:
                target = self._mapped[rkey] = mmap.mmap(fd, 0)
            finally:
                os.close(fd)
        if not os.path.exists(f"/proc/{self.peer_pid}"):
            raise NodeFailure(f"RDMA write to pid {self.peer_pid} failed: the peer is gone (stand-in)")
        return target

    def write(self, source: verbs.MemoryRegion, offset: int, nbytes: int, remote_address: int, rkey: int) -> None:
        target = self._target(rkey)
        if remote_address < 0 or remote_address + nbytes > len(target):
            raise NodeFailure("RDMA write outside the peer's region (remote access error, stand-in)")
        target[remote_address:remote_address + nbytes] = source.view[offset:offset + nbytes]
        self.writes += 1
        self.device.bytes_written += nbytes

    def write_bytes(self, data: bytes, remote_address: int, rkey: int) -> None:
        target = self._target(rkey)
        target[remote_address:remote_address + len(data)] = data
        self.small_writes += 1

    def close(self) -> None:
        for mapping in self._mapped.values():
            mapping.close()
        self._mapped.clear()


class StandInDevice(verbs.Device):
    """Registered memory as memfds, writes as copies into the peer's memfd (see the module's text)."""

    name = "stand-in"

    def __init__(self, interface: Optional[str], gid_index: int) -> None:
        self.interface, self.gid_index = interface, gid_index
        self.queue_pairs: List[StandInQueuePair] = []
        self.bytes_written = 0
        self._regions: List[Any] = []

    def allocate(self, nbytes: int) -> verbs.MemoryRegion:
        fd = os.memfd_create("byteps-stand-in-mr")
        os.ftruncate(fd, max(1, nbytes))
        mapping = mmap.mmap(fd, max(1, nbytes))
        self._regions.append((fd, mapping))
        return verbs.MemoryRegion(0, nbytes, fd, fd, memoryview(mapping)[:nbytes], None)

    def register(self, buffer: Any) -> verbs.MemoryRegion:
        view = memoryview(buffer).cast("B")
        address = ctypes.addressof(ctypes.c_char.from_buffer(view)) if not view.readonly else 0
        return verbs.MemoryRegion(address, view.nbytes, 0, 0, view, buffer)

    def queue_pair(self) -> verbs.QueuePair:
        pair = StandInQueuePair(self)
        self.queue_pairs.append(pair)
        return pair

    def close(self) -> None:
        for pair in self.queue_pairs:
            pair.close()


def install() -> List[StandInDevice]:
    """Every later RDMA device of this process is a stand-in; returns the list they are collected in."""
    def opener(interface: Optional[str], gid_index: int) -> StandInDevice:
        device = StandInDevice(interface, gid_index)
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
