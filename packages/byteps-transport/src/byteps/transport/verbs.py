"""The RDMA verbs the RDMA transport uses, behind one small interface; rdma-core's pyverbs is the real one.

:mod:`byteps.transport.rdma_endpoints` needs few verbs: memory regions that a
peer may write into, reliable-connected queue pairs, and RDMA WRITE (waited
for, or fire-and-forget for a few bytes). They are the interface below. A
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
import os
import random
import threading
import time
from typing import Any, Callable, Dict, Optional

from byteps.transport.errors import NodeFailure, TransportError

__all__ = ["Device", "MemoryRegion", "QueuePair", "PyverbsDevice", "open_device", "use_device", "RdmaUnavailable"]

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
    """One reliable-connected queue pair (an interface)."""

    def info(self) -> bytes:
        """What the peer needs to connect its queue pair to this one."""
        raise NotImplementedError

    def connect(self, peer: bytes) -> None:
        """Connect to the peer's queue pair (its :meth:`info`): ready to send and receive."""
        raise NotImplementedError

    def write(self, source: MemoryRegion, offset: int, nbytes: int, remote_address: int, rkey: int) -> None:
        """RDMA WRITE ``nbytes`` of ``source`` from ``offset`` to the peer's memory; returns once it is placed.

        A failure (the peer gone, its queue pair broken) is a :class:`NodeFailure`.
        """
        raise NotImplementedError

    def write_bytes(self, data: bytes, remote_address: int, rkey: int) -> None:
        """RDMA WRITE a few bytes (inline); not waited for."""
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


# --- rdma-core through pyverbs (unverified: no RDMA device was available, docs/rdma.md) -----------------------
_QUEUE_DEPTH = 1024  # send work requests in flight per queue pair (waited writes, and unsignaled small ones)
_SIGNAL_EVERY = 64  # every so many small writes is signaled, so the send queue's slots come back
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
        # One completion queue for every queue pair: work request ids are numbered per device, and a thread
        # that polls keeps the completions it is not waiting for, so that no wait steals another's (the
        # receiver's page-freeing writes come from whichever thread drops a payload's last view).
        self._lock = threading.Lock()
        self._next_id = 1
        self._done: Dict[int, Optional[str]] = {}  # wr_id -> None (success) or what failed

    def post(self, qp: Any, sge: Any, remote_address: int, rkey: int, flags: int, peer: str) -> int:
        """Post one RDMA WRITE on ``qp``; returns its work request id."""
        with self._lock:
            wr_id, self._next_id = self._next_id, self._next_id + 1
            request = self._v["wr"].SendWR(wr_id=wr_id, opcode=self._v["e"].IBV_WR_RDMA_WRITE, num_sge=1,
                                           sg=[sge], send_flags=flags)
            request.set_wr_rdma(rkey, remote_address)
            try:
                qp.post_send(request)
            except Exception as exc:  # noqa: BLE001 -- pyverbs' error, as a node failure
                raise NodeFailure(f"RDMA write to {peer} could not be posted ({exc})") from None
        return wr_id

    def wait(self, wr_id: int, peer: str) -> None:
        """Until work request ``wr_id`` completed; a NodeFailure if it failed."""
        success = self._v["e"].IBV_WC_SUCCESS
        empty = 0
        while True:
            with self._lock:
                if wr_id in self._done:
                    failure = self._done.pop(wr_id)
                    if failure is not None:
                        raise NodeFailure(f"RDMA write to {peer} failed ({failure}): the peer is gone or its "
                                          "queue pair broke")
                    return
                count, completions = self._cq.poll()
                for completion in completions[:count]:
                    self._done[completion.wr_id] = None if completion.status == success else \
                        f"work completion status {completion.status}"
            if not count:
                empty += 1
                if empty % _SPINS == 0:
                    time.sleep(0)  # let the process's other threads run (pyverbs' poll holds the GIL)

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
    def __init__(self, device: PyverbsDevice) -> None:
        v, self._device = device._v, device
        self._v, self._e = v, v["e"]
        cap = v["qp"].QPCap(max_send_wr=_QUEUE_DEPTH, max_recv_wr=1, max_send_sge=1, max_recv_sge=1,
                            max_inline_data=64)
        init = v["qp"].QPInitAttr(qp_type=self._e.IBV_QPT_RC, scq=device._cq, rcq=device._cq, cap=cap)
        self._qp = v["qp"].QP(device._pd, init)
        self._psn = random.getrandbits(24)
        attr = v["qp"].QPAttr(port_num=device.port)
        attr.qp_access_flags = self._e.IBV_ACCESS_LOCAL_WRITE | self._e.IBV_ACCESS_REMOTE_WRITE
        self._qp.to_init(attr)
        self._small = 0
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
        device.wait(device.post(self._qp, sge, remote_address, rkey, self._e.IBV_SEND_SIGNALED, self.peer),
                    self.peer)

    def write_bytes(self, data: bytes, remote_address: int, rkey: int) -> None:
        buffer = ctypes.create_string_buffer(data, len(data))
        sge = self._v["wr"].SGE(ctypes.addressof(buffer), len(data), 0)
        self._small += 1
        signaled = self._small % _SIGNAL_EVERY == 0
        flags = self._e.IBV_SEND_INLINE | (self._e.IBV_SEND_SIGNALED if signaled else 0)
        wr_id = self._device.post(self._qp, sge, remote_address, rkey, flags, self.peer)
        if signaled:
            self._device.wait(wr_id, self.peer)

    def close(self) -> None:
        self._qp.close()

