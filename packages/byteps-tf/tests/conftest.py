"""Fixtures shared by byteps-tf's tests."""

import pytest

from byteps.testkit import one_process_adapter


@pytest.fixture
def bps(monkeypatch):
    """The adapter, initialised as one worker process (no byteps variables from the environment)."""
    with one_process_adapter(monkeypatch, "byteps.tensorflow") as adapter:
        yield adapter
