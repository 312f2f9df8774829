"""Fixtures: ``job``, a :class:`launcher_harness.Job` that cleans up after every test; ``hosts``, two ssh hosts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from launcher_harness import Job

from byteps.testkit import SshHosts, sshd_available

#: The "hosts" of the ssh tests: loopback addresses, an sshd of the test's own on each.
SSH_HOSTS = ["127.0.0.2", "127.0.0.3"]


@pytest.fixture
def job(tmp_path: Path):
    piddir = tmp_path / "pids"
    piddir.mkdir()
    tracker = Job(piddir)
    yield tracker
    tracker.cleanup()


@pytest.fixture
def hosts(tmp_path: Path):
    """An OpenSSH server on each of SSH_HOSTS (byteps.testkit.SshHosts), stopped after the test.

    Skips without openssh-server, except under `nox -s tests-engines`, which installs it and sets
    BYTEPS_REQUIRE_ENGINES=1: there a missing sshd fails, never skips.
    """
    if not sshd_available() and os.environ.get("BYTEPS_REQUIRE_ENGINES") != "1":
        pytest.skip("openssh-server is not installed (nox -s tests-engines installs it)")
    with SshHosts(tmp_path / "ssh", SSH_HOSTS) as running:
        yield running
