"""What every worker script under tests/scripts/ checks with: byteps.testkit's checks, and torch's assertions.

Each script runs named checks on every rank (``check`` / ``Checks`` print
``OK <name>``, or ``FAIL <name>: <traceback>`` and exit 1 at once; see
byteps.testkit.checks); the tensor comparisons are torch's own.
"""

from __future__ import annotations

import torch

from byteps.testkit.checks import Checks, check, expect_error

__all__ = ["Checks", "check", "assert_equal", "assert_close", "expect_error"]


def assert_equal(actual: torch.Tensor, expected: torch.Tensor, what: str, rtol: float = 0.0,
                 atol: float = 0.0) -> None:
    """Same dtype and shape, values within tolerance (exact by default)."""
    assert isinstance(actual, torch.Tensor), f"{what}: got a {type(actual).__name__}"
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str, rtol: float = 1e-5,
                 atol: float = 1e-6) -> None:
    """Same dtype and shape, values within float32-sized tolerances."""
    assert_equal(actual, expected, what, rtol=rtol, atol=atol)
