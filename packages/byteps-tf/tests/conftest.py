"""Fixtures shared by byteps-tf's tests."""

import pytest

from byteps.testkit import unset_byteps_env


@pytest.fixture
def bps(monkeypatch):
    """The adapter, initialised as one worker process (no byteps variables from the environment)."""
    unset_byteps_env(monkeypatch)
    import byteps.tensorflow as bps

    bps.init()
    yield bps
    bps.shutdown()
