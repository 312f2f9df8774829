"""What the worker scripts under tests/scripts/ check with: byteps.testkit's checks, and tensor assertions.

Each script runs named checks on every rank (``Checks`` prints ``OK <name>``,
or ``FAIL <name>: <traceback>`` and exits 1 at once, and ``ALL OK <n>`` at
the end; see byteps.testkit.checks); the tensor comparisons are here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from byteps.testkit.checks import Checks, expect_error

__all__ = ["Checks", "assert_equal", "assert_close", "expect_error"]


def _numpy(value: Any) -> np.ndarray:
    if hasattr(value, "numpy"):
        value = value.numpy()
    return np.asarray(value)


def assert_equal(actual: Any, expected: Any, what: str, rtol: float = 0.0, atol: float = 0.0) -> None:
    """Same dtype (for tensors) and shape, values within tolerance (exact by default)."""
    if hasattr(actual, "dtype") and hasattr(expected, "dtype") and hasattr(actual, "numpy") \
            and hasattr(expected, "numpy"):
        assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype.name} != {expected.dtype.name}"
    a, e = _numpy(actual), _numpy(expected)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    a64, e64 = a.astype(np.float64), e.astype(np.float64)
    if not np.allclose(a64, e64, rtol=rtol, atol=atol):
        worst = float(np.max(np.abs(a64 - e64))) if a.size else 0.0
        raise AssertionError(f"{what}: largest difference {worst}\nactual {a.ravel()[:12]}\nexpected {e.ravel()[:12]}")


def assert_close(actual: Any, expected: Any, what: str, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert_equal(actual, expected, what, rtol=rtol, atol=atol)
