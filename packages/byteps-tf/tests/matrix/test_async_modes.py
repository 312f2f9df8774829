"""Asynchronous training (tests/test_async.py's job and checks) in the modes the default run leaves out for CI
time: a DistributedGradientTape loop run eagerly, and the TF1 DistributedOptimizer in a TF1 graph."""

from __future__ import annotations

import pytest
from test_async import fast_worker_does_not_wait_and_every_delta_lands_once


@pytest.mark.parametrize("mode", ["tape-eager", "tf1-graph"])
def test_fast_worker_does_not_wait_and_every_delta_lands_once(tmp_path, mode):
    fast_worker_does_not_wait_and_every_delta_lands_once(tmp_path, mode)
