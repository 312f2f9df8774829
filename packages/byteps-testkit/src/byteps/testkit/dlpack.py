"""DLPack capsules made with ctypes, and the checks every adapter's DLPack reader must pass.

A test controls here what no framework produces: a device byteps cannot
read, an exotic dtype, strides, a shape whose byte size overflows, a
capsule consumed by someone else while byteps reads it. Each adapter's
tests call the checks with its own ``_C.from_dlpack``::

    from byteps.testkit.dlpack import FakeTensor, check_taken_once
    check_taken_once(_C.from_dlpack)

numpy is imported here (the adapters' test environments all have it).
"""

from __future__ import annotations

import ctypes
import gc
from typing import Any, Callable, Optional, Sequence

import numpy as np

__all__ = ["DLPackReaderTests", "FakeTensor", "OVERFLOWING_SHAPES", "check_overflow_refused", "check_zero_extent",
           "check_taken_once"]


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class FakeTensor:
    """A DLPack producer over ``array`` (default: 4 float32 zeros) that counts its deleter's calls.

    ``shape`` may claim any shape (default: the array's); ``device_type``,
    ``code``/``bits``/``lanes``, ``strides`` and the capsule ``name`` are
    what the capsule says, whatever the array really is.
    """

    def __init__(self, array: Any = None, *, shape: Optional[Sequence[int]] = None, device_type: int = 1,
                 code: int = 2, bits: int = 32, lanes: int = 1, strides: Optional[Sequence[int]] = None,
                 name: Optional[bytes] = None) -> None:
        self.array = np.zeros(4, dtype=np.float32) if array is None else np.ascontiguousarray(array)
        dims = tuple(self.array.shape if shape is None else shape)
        self.shape = (ctypes.c_int64 * max(len(dims), 1))(*dims)
        self.strides = (ctypes.c_int64 * max(len(dims), 1))(*strides) if strides else None
        self.deleted = 0
        self.deleter = DELETER(self._delete)
        self.managed = DLManagedTensor()
        self.managed.dl_tensor = DLTensor(self.array.ctypes.data, DLDevice(device_type, 0), len(dims),
                                          DLDataType(code, bits, lanes), self.shape, self.strides, 0)
        self.managed.deleter = self.deleter
        self.name = ctypes.create_string_buffer(name or b"dltensor")
        self.capsule = _capsule_new(ctypes.addressof(self.managed), self.name, None)

    def _delete(self, _pointer) -> None:
        self.deleted += 1


#: float32 shapes whose element count or byte size does not fit 64 bits (or a memoryview).
OVERFLOWING_SHAPES = [(2**32, 2**32), (2**62, 4), (2**61,), (2**40, 2**40, 2**40, 0, -1)]

FromDLPack = Callable[[Any], Any]


def check_overflow_refused(from_dlpack: FromDLPack, shape: Sequence[int]) -> None:
    """A shape whose size overflows is refused, and the capsule stays the producer's."""
    fake = FakeTensor(shape=shape)
    try:
        from_dlpack(fake.capsule)
    except ValueError as exc:
        assert "overflow" in str(exc) or "malformed" in str(exc), str(exc)
    else:
        raise AssertionError(f"shape {shape} was accepted")
    assert '"dltensor"' in repr(fake.capsule) and fake.deleted == 0


def check_zero_extent(from_dlpack: FromDLPack) -> None:
    """A zero extent makes an empty tensor whatever the other extents are."""
    fake = FakeTensor(shape=(2**40, 2**40, 0))
    view, code, shape = from_dlpack(fake.capsule)[:3]
    assert (memoryview(view).nbytes, code, tuple(shape)) == (0, 0, (2**40, 2**40, 0))


def check_taken_once(from_dlpack: FromDLPack) -> None:
    """A capsule consumed by someone else while byteps reads it is taken exactly once.

    The garbage collector runs Python code in the middle of from_dlpack's
    allocations; here that code consumes the same capsule. One call must
    get the tensor, the other raise ValueError, and the deleter run once.
    """
    threshold = gc.get_threshold()
    for trigger in range(1, 16):
        # 21 dimensions: a shape tuple too long for CPython's tuple free list, so making it allocates.
        fake = FakeTensor(np.arange(4, dtype=np.float32), shape=(1,) * 20 + (4,))
        views, collections = [], [0]

        def consume(phase, _info, fake=fake, views=views, collections=collections, trigger=trigger):
            if phase == "start":
                collections[0] += 1
                if collections[0] == trigger:
                    try:
                        views.append(from_dlpack(fake.capsule)[0])
                    except ValueError:
                        pass

        gc.callbacks.append(consume)
        gc.set_threshold(1)
        try:
            views.append(from_dlpack(fake.capsule)[0])
        except ValueError as exc:
            assert "consumed" in str(exc)
        finally:
            gc.set_threshold(*threshold)
            gc.callbacks.remove(consume)
        assert len(views) == 1, f"trigger {trigger}: the tensor was taken {len(views)} times"
        assert np.frombuffer(views[0], dtype=np.float32).tolist() == [0, 1, 2, 3]
        del views[:]
        gc.collect()
        assert fake.deleted == 1, f"trigger {trigger}: deleter ran {fake.deleted} times"


class DLPackReaderTests:
    """The reader's tests, shared: an adapter's test module subclasses it and names its reader::

        class TestDLPackReader(DLPackReaderTests):
            from_dlpack = staticmethod(_C.from_dlpack)
    """

    from_dlpack: FromDLPack

    def test_sizes_that_overflow_are_refused(self):
        # Before: the element count and byte size were multiplied unchecked, so (2**32, 2**32)
        # float32 came back as a 0-byte view claiming 2**64 elements, and (2**61,) as a view of
        # negative size.
        for shape in OVERFLOWING_SHAPES:
            check_overflow_refused(self.from_dlpack, shape)

    def test_a_shape_with_a_zero_extent_is_empty_whatever_its_other_extents(self):
        check_zero_extent(self.from_dlpack)

    def test_a_capsule_consumed_while_byteps_reads_it_is_taken_once(self):
        # Before: the capsule was renamed only after the shape tuple (and, in byteps.mxnet, the
        # owner) had been made, so a re-entrant consumer also took the tensor and its deleter ran twice.
        check_taken_once(self.from_dlpack)
