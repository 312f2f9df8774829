"""The RDMA verbs the RDMA transport uses, behind one small interface; rdma-core's pyverbs is the real one.

:mod:`byteps.transport.rdma_endpoints` needs few verbs: memory regions that a
peer may write into, reliable-connected queue pairs, and RDMA WRITE (from
registered memory, waited for). They are the interface below. A
:class:`Device` is one RDMA device with its protection domain and
completion queue. :class:`PyverbsDevice` runs them on real hardware. It is
imported only when ``DMLC_ENABLE_RDMA=1``, and docs/rdma.md says what of it
was verified where. Tests of the transport's bookkeeping install a
stand-in with :func:`use_device` (``byteps.testkit.verbs_stand_in``);
nothing else does.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import random
import struct
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from byteps.transport.errors import NodeFailure, TransportError

__all__ = ["Device", "MemoryRegion", "QueuePair", "Completions", "CompletionRing", "PyverbsDevice", "open_device",
           "use_device", "RdmaUnavailable"]

_opener: Optional[Callable[[Optional[str], int], Device]] = None


class RdmaUnavailable(TransportError):
    """DMLC_ENABLE_RDMA=1 where RDMA cannot run: pyverbs is missing, or no RDMA device is there."""


def use_device(opener: Optional[Callable[[Optional[str], int], Device]]) -> None:
    """Tests only: open every later RDMA device with ``opener(interface, gid_index)`` (None: pyverbs)."""
    global _opener
    _opener = opener


def open_device(interface: Optional[str] = None, gid_index: int = 0) -> Device:
    """The RDMA device behind network interface ``interface`` (DMLC_INTERFACE; None: the first device)."""
    if _opener is not None:
        return _opener(interface, gid_index)
    return PyverbsDevice(interface, gid_index)


class MemoryRegion:
    """Registered memory: where it is (as the device addresses it), its keys, and a view of it."""

    def __init__(self, address: int, nbytes: int, lkey: int, rkey: int, view: memoryview, keep: Any = None) -> None:
        self.address, self.nbytes, self.lkey, self.rkey = address, nbytes, lkey, rkey
        self.view = view  # the bytes, as a flat uint8 memoryview
        self.keep = keep  # what must stay alive while the region is registered

    def close(self) -> None:
        closer = getattr(self.keep, "close", None)
        if closer is not None:
            closer()


class QueuePair:
    """One reliable-connected queue pair (an interface).

    Every write goes from registered memory (a :class:`MemoryRegion`) and is
    waited for. Nothing the transport sends depends on ``max_inline_data``,
    the most bytes a provider accepts inline: providers differ (64 bytes is
    common, 0 exists), and an inline write over it is refused at post time.
    """

    #: the most bytes this queue pair takes inline (IBV_SEND_INLINE); the transport never needs it
    max_inline_data: int = 0

    def info(self) -> bytes:
        """What the peer needs to connect its queue pair to this one."""
        raise NotImplementedError

    def connect(self, peer: bytes) -> None:
        """Connect to the peer's queue pair (its :meth:`info`): ready to send and receive."""
        raise NotImplementedError

    def write(self, source: MemoryRegion, offset: int, nbytes: int, remote_address: int, rkey: int) -> None:
        """RDMA WRITE ``nbytes`` of ``source`` from ``offset`` to the peer's memory; returns once it is placed.

        Any failure, at post time (a queue pair not ready to send, a full send
        queue) or in the completion (the peer gone, its queue pair broken), is
        a :class:`NodeFailure`.
        """
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class Device:
    """One RDMA device, its protection domain and completion queue (an interface)."""

    name: str = ""

    def allocate(self, nbytes: int) -> MemoryRegion:
        """``nbytes`` of new memory, registered so that a connected peer may write into it."""
        raise NotImplementedError

    def register(self, buffer: Any) -> MemoryRegion:
        """Register a caller's contiguous buffer as a local source of writes."""
        raise NotImplementedError

    def queue_pair(self) -> QueuePair:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class Completions:
    """The completions of one completion queue, for every thread that waits on it: each wait takes its own.

    Work request ids are numbered per device. A thread that polls keeps the
    completions it is not waiting for, so that no wait steals another's:
    the receiver's page-freeing writes come from whichever thread drops a
    payload's last view, even from inside another wait (a finalizer), hence
    the re-entrant lock. ``poll()`` returns ``[(wr_id, failure or None)]``;
    ``idle(empty_polls)`` waits a little for more.
    """

    def __init__(self, poll: Callable[[], List[Tuple[int, Optional[str]]]], idle: Callable[[int], None]) -> None:
        self._poll, self._idle = poll, idle
        self.lock = threading.RLock()
        self._next_id = 1
        self._done: Dict[int, Optional[str]] = {}  # wr_id -> None (success) or what failed

    def next_id(self) -> int:
        with self.lock:
            wr_id, self._next_id = self._next_id, self._next_id + 1
        return wr_id

    def wait(self, wr_id: int, peer: str) -> None:
        """Until work request ``wr_id`` completed; a NodeFailure if it failed."""
        empty = 0
        while True:
            with self.lock:
                if wr_id not in self._done:
                    for done, failure in self._poll():
                        self._done[done] = failure
                if wr_id in self._done:
                    failure = self._done.pop(wr_id)
                    if failure is not None:
                        raise NodeFailure(f"RDMA write to {peer} failed ({failure}): the peer is gone or its "
                                          "queue pair broke")
                    return
            empty += 1
            if wr_id not in self._done:  # another thread may have polled it meanwhile
                self._idle(empty)  # outside the lock, so that it can


class CompletionRing:
    """A completion queue as memory the process reads: a count of entries produced, then the entries.

    This is how a NIC hands completions over (it writes entries into host
    memory), and how :meth:`poll` reads them. Waiting for the count to move
    happens in C++ with the GIL released (``_C.wait_for_change``), so a
    thread that waits for its write costs the process's other threads
    nothing. Layout: u64 produced, u64 overrun flag, then ``entries`` of
    (u64 wr_id, u32 status, u32 queue pair, u32 work requests it completes,
    u32 reserved); status 0 is success. The verbs stand-in produces into one;
    pyverbs does not expose its queue's memory (:class:`PyverbsDevice`).
    """

    HEADER = struct.Struct("<QQ")
    ENTRY = struct.Struct("<QIIII")

    def __init__(self, entries: int) -> None:
        self.entries = entries
        self.memory = mmap.mmap(-1, self.HEADER.size + entries * self.ENTRY.size)
        self.consumed = 0
        self.polls = 0  # calls of poll(): a thread that waits without the GIL makes few

    def produced(self) -> int:
        return self.HEADER.unpack_from(self.memory)[0]

    def overrun(self) -> bool:
        return bool(self.HEADER.unpack_from(self.memory)[1])

    def push(self, wr_id: int, status: int, queue_pair: int, covers: int) -> bool:
        """The producer's side: one entry; False (and the queue marked overrun) when the reader fell behind."""
        produced = self.produced()
        if produced - self.consumed >= self.entries:
            self.HEADER.pack_into(self.memory, 0, produced + 1, 1)  # wake the waiters: they see the overrun
            return False
        self.ENTRY.pack_into(self.memory, self.HEADER.size + (produced % self.entries) * self.ENTRY.size,
                             wr_id, status, queue_pair, covers, 0)
        self.HEADER.pack_into(self.memory, 0, produced + 1, 0)
        return True

    def poll(self) -> List[Tuple[int, int, int, int]]:
        """The entries produced since the last poll: ``[(wr_id, status, queue pair, covers)]``."""
        self.polls += 1
        produced = self.produced()
        if self.overrun():
            raise NodeFailure("the RDMA completion queue overran (more completions than entries): every queue "
                              "pair on it is broken")
        start = self.consumed
        found = [self.ENTRY.unpack_from(self.memory, self.HEADER.size + (i % self.entries) * self.ENTRY.size)[:4]
                 for i in range(start, produced)]
        self.consumed = max(self.consumed, produced)
        return found

    def idle(self, empty: int) -> None:
        """Until the producer moves (checked without the GIL), for up to 16 million spins."""
        from byteps.transport import _C  # the extension; imported here so that verbs' interface needs none

        _C.wait_for_change(self.memory, 0, self.consumed, 1 << 24)


# --- rdma-core through pyverbs (unverified: no RDMA device was available, docs/rdma.md) -----------------------
_QUEUE_DEPTH = 1024  # send work requests in flight per queue pair (every write is signaled and waited)
_SPINS = 64  # empty polls of the completion queue between yields of the GIL


def _import_pyverbs() -> Dict[str, Any]:
    try:
        import pyverbs.cq
        import pyverbs.device
        import pyverbs.enums
        import pyverbs.mr
        import pyverbs.pd
        import pyverbs.qp
        import pyverbs.wr
        from pyverbs.addr import GID, AHAttr, GlobalRoute
    except ImportError as exc:
        raise RdmaUnavailable(
            f"DMLC_ENABLE_RDMA=1 needs pyverbs, rdma-core's Python bindings ({exc}): pip install "
            "'byteps-transport[rdma]' with rdma-core's libibverbs1 and librdmacm1 installed; or unset "
            "DMLC_ENABLE_RDMA to use TCP") from None
    return {"device": pyverbs.device, "pd": pyverbs.pd, "cq": pyverbs.cq, "mr": pyverbs.mr, "qp": pyverbs.qp,
            "wr": pyverbs.wr, "e": pyverbs.enums, "AHAttr": AHAttr, "GID": GID, "GlobalRoute": GlobalRoute}


def _device_of_interface(interface: str) -> Optional[str]:
    """The RDMA device whose port carries network interface ``interface`` (sysfs), or None."""
    root = "/sys/class/infiniband"
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else ():
        if os.path.exists(os.path.join(root, name, "device", "net", interface)):
            return name
    return None


class PyverbsDevice(Device):
    """An RDMA device through pyverbs: one protection domain and one completion queue per process."""

    def __init__(self, interface: Optional[str], gid_index: int = 0, port: int = 1) -> None:
        v = self._v = _import_pyverbs()
        names = [d.name.decode() if isinstance(d.name, bytes) else d.name for d in v["device"].get_device_list()]
        if not names:
            raise RdmaUnavailable("DMLC_ENABLE_RDMA=1 but pyverbs lists no RDMA device on this machine; unset "
                                  "DMLC_ENABLE_RDMA to use TCP (soft-RoCE: rdma link add rxe0 type rxe netdev IF)")
        chosen = _device_of_interface(interface) if interface else names[0]
        if chosen is None:
            raise RdmaUnavailable(f"DMLC_INTERFACE={interface} is not the network interface of an RDMA device "
                                  f"(devices: {', '.join(names)}); name the RDMA NIC's interface")
        self.name, self.port, self.gid_index = chosen, port, gid_index
        self._context = v["device"].Context(name=chosen)
        self._pd = v["pd"].PD(self._context)
        self._cq = v["cq"].CQ(self._context, 4 * _QUEUE_DEPTH)
        port_attr = self._context.query_port(port)
        self.lid = port_attr.lid
        self.gid = str(self._context.query_gid(port, gid_index))
        self.mtu = port_attr.active_mtu
        # One completion queue for every queue pair. pyverbs' CQ.poll holds the GIL and its queue's memory is
        # not exposed, so this waiting is a Python loop that yields the GIL every _SPINS empty polls; the
        # GIL-free wait (CompletionRing) needs the completion queue's memory (docs/rdma.md, unverified here).
        self.completions = Completions(self._poll, self._idle)

    def _poll(self) -> List[Tuple[int, Optional[str]]]:
        success = self._v["e"].IBV_WC_SUCCESS
        count, completions = self._cq.poll()
        return [(c.wr_id, None if c.status == success else f"work completion status {c.status}")
                for c in completions[:count]]

    @staticmethod
    def _idle(empty: int) -> None:
        if empty % _SPINS == 0:
            time.sleep(0)  # let the process's other threads run

    def post(self, qp: Any, sge: Any, remote_address: int, rkey: int, flags: int, peer: str) -> int:
        """Post one RDMA WRITE on ``qp``; returns its work request id."""
        wr_id = self.completions.next_id()
        request = self._v["wr"].SendWR(wr_id=wr_id, opcode=self._v["e"].IBV_WR_RDMA_WRITE, num_sge=1,
                                       sg=[sge], send_flags=flags)
        request.set_wr_rdma(rkey, remote_address)
        with self.completions.lock:
            try:
                qp.post_send(request)
            except Exception as exc:  # noqa: BLE001 -- pyverbs' error, as a node failure
                raise NodeFailure(f"RDMA write to {peer} could not be posted ({exc})") from None
        return wr_id

    def allocate(self, nbytes: int) -> MemoryRegion:
        e = self._v["e"]
        access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
        mr = self._v["mr"].MR(self._pd, nbytes, access)
        view = memoryview((ctypes.c_char * nbytes).from_address(mr.buf)).cast("B")
        return MemoryRegion(mr.buf, nbytes, mr.lkey, mr.rkey, view, mr)

    def register(self, buffer: Any) -> MemoryRegion:
        view = memoryview(buffer).cast("B")
        if view.readonly:  # bytes: registered memory must be writable, so a copy of our own
            region = self.allocate(view.nbytes)
            region.view[:] = view
            return region
        address = ctypes.addressof(ctypes.c_char.from_buffer(view))
        mr = self._v["mr"].MR(self._pd, view.nbytes, self._v["e"].IBV_ACCESS_LOCAL_WRITE, address=address)
        return MemoryRegion(address, view.nbytes, mr.lkey, mr.rkey, view, mr)

    def queue_pair(self) -> QueuePair:
        return _PyverbsQueuePair(self)

    def close(self) -> None:
        for item in (self._cq, self._pd, self._context):
            item.close()


class _PyverbsQueuePair(QueuePair):
    max_inline_data = 0  # nothing is sent inline: every write comes from registered memory

    def __init__(self, device: PyverbsDevice) -> None:
        v, self._device = device._v, device
        self._v, self._e = v, v["e"]
        cap = v["qp"].QPCap(max_send_wr=_QUEUE_DEPTH, max_recv_wr=1, max_send_sge=1, max_recv_sge=1,
                            max_inline_data=self.max_inline_data)
        init = v["qp"].QPInitAttr(qp_type=self._e.IBV_QPT_RC, scq=device._cq, rcq=device._cq, cap=cap)
        self._qp = v["qp"].QP(device._pd, init)
        self._psn = random.getrandbits(24)
        attr = v["qp"].QPAttr(port_num=device.port)
        attr.qp_access_flags = self._e.IBV_ACCESS_LOCAL_WRITE | self._e.IBV_ACCESS_REMOTE_WRITE
        self._qp.to_init(attr)
        self.peer = "the peer"

    def info(self) -> bytes:
        device = self._device
        return json.dumps({"qpn": self._qp.qp_num, "psn": self._psn, "lid": device.lid, "gid": device.gid,
                           "pid": os.getpid()}).encode()

    def connect(self, peer: bytes) -> None:
        v, device = self._v, self._device
        fields = json.loads(peer)
        self.peer = f"queue pair {fields['qpn']} (pid {fields.get('pid')})"
        attr = v["qp"].QPAttr(port_num=device.port)
        attr.path_mtu = device.mtu
        attr.dest_qp_num = fields["qpn"]
        attr.rq_psn = fields["psn"]
        attr.max_dest_rd_atomic = 1
        attr.min_rnr_timer = 12
        route = v["GlobalRoute"](dgid=v["GID"](fields["gid"]), sgid_index=device.gid_index)
        attr.ah_attr = v["AHAttr"](port_num=device.port, is_global=1, gr=route, dlid=fields["lid"])
        self._qp.to_rtr(attr)
        attr.sq_psn = self._psn
        attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.max_rd_atomic = 14, 7, 7, 1
        self._qp.to_rts(attr)

    def write(self, source: MemoryRegion, offset: int, nbytes: int, remote_address: int, rkey: int) -> None:
        sge = self._v["wr"].SGE(source.address + offset, nbytes, source.lkey)
        device = self._device
        wr_id = device.post(self._qp, sge, remote_address, rkey, self._e.IBV_SEND_SIGNALED, self.peer)
        device.completions.wait(wr_id, self.peer)

    def close(self) -> None:
        self._qp.close()

