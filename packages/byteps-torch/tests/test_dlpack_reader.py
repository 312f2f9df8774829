"""byteps.torch._C on byteps-common's DLPack reader: sizes and ownership.

The capsules here are made with ctypes, so that a test controls what torch
never produces: shapes whose byte size overflows, and a capsule consumed by
someone else while byteps is reading it.
"""

from __future__ import annotations

import ctypes
import gc

import numpy as np
import pytest

from byteps.torch import _C


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
CAPSULE_NAME = ctypes.create_string_buffer(b"dltensor")


class FakeTensor:
    """A float32 DLPack producer over a small array that may claim any shape; counts its deleter's calls."""

    def __init__(self, shape, array=None) -> None:
        self.array = np.zeros(4, dtype=np.float32) if array is None else np.ascontiguousarray(array)
        self.shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self.deleted = 0
        self.deleter = DELETER(self._delete)
        self.managed = DLManagedTensor()
        self.managed.dl_tensor = DLTensor(self.array.ctypes.data, DLDevice(1, 0), len(shape), DLDataType(2, 32, 1),
                                          self.shape, None, 0)
        self.managed.deleter = self.deleter
        self.capsule = _capsule_new(ctypes.addressof(self.managed), CAPSULE_NAME, None)

    def _delete(self, _pointer) -> None:
        self.deleted += 1


@pytest.mark.parametrize("shape", [(2**32, 2**32), (2**62, 4), (2**61,), (2**40, 2**40, 2**40, 0, -1)])
def test_sizes_that_overflow_are_refused(shape):
    # Before: the element count and byte size were multiplied unchecked, so (2**32, 2**32) float32
    # came back as a 0-byte view claiming 2**64 elements, and (2**61,) as a view of negative size.
    fake = FakeTensor(shape)
    with pytest.raises(ValueError, match="overflow|malformed"):
        _C.from_dlpack(fake.capsule)
    assert '"dltensor"' in repr(fake.capsule) and fake.deleted == 0  # still the producer's


def test_a_shape_with_a_zero_extent_is_empty_whatever_its_other_extents():
    fake = FakeTensor((2**40, 2**40, 0))
    view, code, shape = _C.from_dlpack(fake.capsule)
    assert (view.nbytes, code, shape) == (0, 0, (2**40, 2**40, 0))


def test_a_capsule_consumed_while_byteps_reads_it_is_taken_once():
    # The garbage collector runs Python code in the middle of from_dlpack's allocations; here
    # that code consumes the same capsule. Before: the capsule was renamed only after the shape
    # tuple (and, in byteps.mxnet, the owner) had been made, so both calls took the tensor and
    # its deleter ran twice. Now exactly one call gets it and the other raises ValueError.
    threshold = gc.get_threshold()
    for trigger in range(1, 16):
        # 21 dimensions: a shape tuple too long for CPython's tuple free list, so making it
        # allocates, and may collect, as a real (non-reused) allocation does.
        fake = FakeTensor((1,) * 20 + (4,), np.arange(4, dtype=np.float32))
        views, collections = [], [0]

        def consume(phase, _info, fake=fake, views=views, collections=collections, trigger=trigger):
            if phase == "start":
                collections[0] += 1
                if collections[0] == trigger:
                    try:
                        views.append(_C.from_dlpack(fake.capsule)[0])
                    except ValueError:
                        pass

        gc.callbacks.append(consume)
        gc.set_threshold(1)
        try:
            views.append(_C.from_dlpack(fake.capsule)[0])
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
