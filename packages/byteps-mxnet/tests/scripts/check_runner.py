"""Check runner shared by the worker scripts under tests/scripts/.

Each script runs named checks on every rank and prints ``OK <name>`` or
``FAIL <name>: <traceback>``; ``ALL OK <n>`` at the end. A failing check ends
the process at once (exit 1): the other ranks may wait for push_pulls it
will never send, and the launcher tears the job down as soon as a worker
fails.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Callable

import mxnet as mx
import numpy as np

__all__ = ["Checks", "assert_array", "expect_error"]


class Checks:
    def __init__(self) -> None:
        self.passed = 0

    def run(self, name: str, body: Callable[[], None]) -> None:
        try:
            body()
        except BaseException:
            print(f"FAIL {name}: " + traceback.format_exc().replace("\n", "\n    "), flush=True)
            sys.stderr.flush()
            os._exit(1)
        self.passed += 1
        print(f"OK {name}", flush=True)

    def done(self) -> None:
        print(f"ALL OK {self.passed}", flush=True)


def assert_array(actual: mx.nd.NDArray, expected: np.ndarray, what: str, rtol: float = 0.0,
                 atol: float = 0.0) -> None:
    """An NDArray of the expected dtype and shape whose values are within tolerance (exact by default)."""
    assert isinstance(actual, mx.nd.NDArray), f"{what}: got a {type(actual).__name__}"
    got = actual.asnumpy()
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype}, expected {expected.dtype}"
    assert got.shape == expected.shape, f"{what}: shape {got.shape}, expected {expected.shape}"
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol,
                               err_msg=what)


def expect_error(kind: type, text: str, call: Callable[[], object]) -> str:
    """``call()`` must raise ``kind`` with ``text`` in its message; returns the message."""
    try:
        call()
    except kind as exc:
        assert text in str(exc), f"{kind.__name__} without {text!r}: {exc}"
        return str(exc)
    raise AssertionError(f"no {kind.__name__} ({text!r}) was raised")
