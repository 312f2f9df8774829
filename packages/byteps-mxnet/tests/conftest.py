"""pytest settings and shared fixtures of byteps-mxnet's tests."""

import pytest

from byteps.testkit import one_process_adapter


def pytest_configure(config):
    # mxnet 1.9 itself looks up scipy.sparse.csr.csr_matrix, which scipy deprecated: not ours to fix.
    config.addinivalue_line("filterwarnings", "ignore:Please use `csr_matrix`:DeprecationWarning")


@pytest.fixture
def bps(monkeypatch):
    """The adapter, initialised as one worker process (no byteps variables from the environment)."""
    with one_process_adapter(monkeypatch, "byteps.mxnet") as adapter:
        yield adapter
