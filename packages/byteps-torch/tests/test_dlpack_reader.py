"""byteps.torch._C on byteps-common's DLPack reader: sizes and ownership.

The capsules here are made with ctypes, so that a test controls what torch
never produces: shapes whose byte size overflows, and a capsule consumed by
someone else while byteps is reading it.
"""

from __future__ import annotations

from byteps.testkit.dlpack import DLPackReaderTests
from byteps.torch import _C


class TestDLPackReader(DLPackReaderTests):
    """Sizes that overflow, a zero extent, a capsule taken once (byteps.testkit.dlpack)."""

    from_dlpack = staticmethod(_C.from_dlpack)
