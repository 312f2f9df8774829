"""Check runner shared by the worker scripts under tests/scripts/.

Each script runs named checks on every rank and prints ``OK <name>`` or
``FAIL <name>: <traceback>``. A failing check ends the process at once (exit
1): the other ranks may wait for push_pulls it will never send, and the
launcher tears the job down as soon as a worker fails.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any, Callable

import numpy as np

__all__ = ["Checks", "assert_equal", "assert_close", "expect_error"]


class Checks:
    """Runs checks in order and counts them."""

    def __init__(self) -> None:
        self.count = 0

    def run(self, name: str, body: Callable[[], None]) -> None:
        try:
            body()
        except BaseException:
            print(f"FAIL {name}: " + traceback.format_exc().replace("\n", "\n    "), flush=True)
            sys.stderr.flush()
            os._exit(1)
        self.count += 1
        print(f"OK {name}", flush=True)

    def done(self) -> None:
        print(f"ALL OK {self.count}", flush=True)


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


def expect_error(kind: Any, text: str, call: Callable[[], object]) -> str:
    """``call()`` must raise ``kind`` with ``text`` in its message; returns the message."""
    try:
        call()
    except kind as exc:
        assert text in str(exc), f"{getattr(kind, '__name__', kind)} without {text!r}: {exc}"
        return str(exc)
    raise AssertionError(f"no {getattr(kind, '__name__', kind)} ({text!r}) was raised")
