"""Check runner shared by every worker script under tests/scripts/.

Each script runs named checks on every rank and prints ``OK <name>`` or
``FAIL <name>: <traceback>``. A failing check ends the process at once (exit
1): the other ranks may wait for push_pulls it will never send, and the
launcher tears the job down as soon as a worker fails.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Callable

import torch

__all__ = ["check", "assert_equal", "assert_close", "expect_error"]


def check(name: str, body: Callable[[], None]) -> None:
    try:
        body()
    except BaseException:
        print(f"FAIL {name}: " + traceback.format_exc().replace("\n", "\n    "), flush=True)
        sys.stderr.flush()
        os._exit(1)
    print(f"OK {name}", flush=True)


def assert_equal(actual: torch.Tensor, expected: torch.Tensor, what: str, rtol: float = 0.0,
                 atol: float = 0.0) -> None:
    """Same dtype and shape, values within tolerance (exact by default)."""
    assert isinstance(actual, torch.Tensor), f"{what}: got a {type(actual).__name__}"
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str, rtol: float = 1e-5,
                 atol: float = 1e-6) -> None:
    """Same dtype and shape, values within float32-sized tolerances."""
    assert_equal(actual, expected, what, rtol=rtol, atol=atol)


def expect_error(kind: type, text: str, call: Callable[[], object]) -> str:
    """``call()`` must raise ``kind`` with ``text`` in its message; returns the message."""
    try:
        call()
    except kind as exc:
        assert text in str(exc), f"{kind.__name__} without {text!r}: {exc}"
        return str(exc)
    raise AssertionError(f"no {kind.__name__} ({text!r}) was raised")
