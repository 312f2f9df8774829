"""byteps.mxnet._C on byteps-common's DLPack reader: sizes and ownership.

The capsules here are made with ctypes, so that a test controls what MXNet
never produces: shapes whose byte size overflows, and a capsule consumed by
someone else while byteps is reading it (before, byteps.mxnet took the
tensor first and renamed the capsule last, so any failure or re-entry in
between left the tensor with two owners).
"""

from __future__ import annotations

import pytest

from byteps.testkit.dlpack import DLPackReaderTests

pytest.importorskip("byteps.mxnet")  # byteps.mxnet needs mxnet; these tests do not
from byteps.mxnet import _C  # noqa: E402


class TestDLPackReader(DLPackReaderTests):
    """Sizes that overflow, a zero extent, a capsule taken once (byteps.testkit.dlpack)."""

    from_dlpack = staticmethod(_C.from_dlpack)
