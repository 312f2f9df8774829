"""The ``job`` fixture: a :class:`launcher_harness.Job` that cleans up after every test."""

from __future__ import annotations

from pathlib import Path

import pytest
from launcher_harness import Job


@pytest.fixture
def job(tmp_path: Path):
    piddir = tmp_path / "pids"
    piddir.mkdir()
    tracker = Job(piddir)
    yield tracker
    tracker.cleanup()
