"""hvd.SyncBatchNorm: each rank's slice normalized as one process normalizes the whole batch."""

import os
import sys

import pytest
import torch

from byteps.testkit import one_process_adapter, run_job

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKS = [sys.executable, os.path.join(HERE, "scripts", "sync_batch_norm_checks.py")]


@pytest.mark.parametrize("workers,servers,local_size", [(2, 1, 1), (1, 0, 3)])
def test_sync_batch_norm_matches_batch_norm_on_the_whole_batch(workers, servers, local_size):
    result = run_job(CHECKS, workers, servers, local_size=local_size, timeout=180)
    assert not result.timed_out, result.failures()
    assert all(code == 0 for code in result.codes.values()), result.failures()
    size = workers * local_size
    for rank in range(size):
        assert f"SYNCBN OK rank {rank} of {size} on cpu" in result.outputs[f"worker{rank}"]


def test_one_process_is_batch_norm(monkeypatch):
    with one_process_adapter(monkeypatch, "byteps.torch") as bps:
        torch.manual_seed(0)
        x = torch.randn(6, 3, 4)
        synced, reference = bps.SyncBatchNorm(3), torch.nn.BatchNorm1d(3)
        assert torch.allclose(synced(x), reference(x))
        assert torch.allclose(synced.running_var, reference.running_var)


def test_bad_input_is_named(monkeypatch):
    with one_process_adapter(monkeypatch, "byteps.torch") as bps:
        with pytest.raises(ValueError, match="SyncBatchNorm: expected an input of at least 2 dimensions"):
            bps.SyncBatchNorm(3)(torch.randn(3))


