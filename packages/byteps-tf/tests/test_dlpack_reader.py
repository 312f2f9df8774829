"""byteps.tensorflow._C on byteps-common's DLPack reader: contiguity, sizes and ownership.

The capsules here are made with ctypes, so that a test controls what
TensorFlow never produces: shapes whose byte size overflows, and a capsule
consumed by someone else while byteps is reading it. No TensorFlow needed.
"""

from __future__ import annotations

import numpy as np
import pytest

from byteps.tensorflow import _C
from byteps.testkit.dlpack import DLPackReaderTests


class TestDLPackReader(DLPackReaderTests):
    """Sizes that overflow, a zero extent, a capsule taken once (byteps.testkit.dlpack)."""

    from_dlpack = staticmethod(_C.from_dlpack)


def test_write_at_refuses_a_non_contiguous_source():
    # Before: write_at copied size * itemsize bytes from the first element's address whatever
    # the strides, so a strided view wrote the wrong elements (and read past its last one).
    buffer = _C.HostBuffer(16, zero=True)
    source = np.arange(8, dtype=np.float32)[::2]
    with pytest.raises(ValueError, match="C-contiguous"):
        buffer.write_at(0, source)
    assert not np.frombuffer(buffer, dtype=np.uint8).any()
    buffer.write_at(0, np.ascontiguousarray(source))
    assert np.frombuffer(buffer, dtype=np.float32).tolist() == [0, 2, 4, 6]
    with pytest.raises(TypeError, match="buffer protocol"):
        buffer.write_at(0, [1.0, 2.0])


@pytest.mark.parametrize("shape", [[2**62, 4], [2**32, 2**32], [2**61]])
def test_to_dlpack_refuses_a_shape_whose_size_overflows(shape):
    # Before: prod(shape) * itemsize wrapped around to a small number, which "fit" the buffer,
    # and TensorFlow was handed a capsule claiming 2**64 elements over 8 bytes.
    with pytest.raises(ValueError, match="overflow"):
        _C.HostBuffer(8).to_dlpack(0, shape)

