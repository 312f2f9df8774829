"""What the worker scripts under tests/scripts/ check with: byteps.testkit's checks, and NDArray assertions.

Each script runs named checks on every rank (``Checks`` prints ``OK <name>``,
or ``FAIL <name>: <traceback>`` and exits 1 at once, and ``ALL OK <n>`` at
the end; see byteps.testkit.checks); the NDArray comparison is here.
"""

from __future__ import annotations

import mxnet as mx
import numpy as np

from byteps.testkit.checks import Checks, expect_error

__all__ = ["Checks", "assert_array", "expect_error"]


def assert_array(actual: mx.nd.NDArray, expected: np.ndarray, what: str, rtol: float = 0.0,
                 atol: float = 0.0) -> None:
    """An NDArray of the expected dtype and shape whose values are within tolerance (exact by default)."""
    assert isinstance(actual, mx.nd.NDArray), f"{what}: got a {type(actual).__name__}"
    got = actual.asnumpy()
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype}, expected {expected.dtype}"
    assert got.shape == expected.shape, f"{what}: shape {got.shape}, expected {expected.shape}"
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol,
                               err_msg=what)
