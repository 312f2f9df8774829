"""Horovod's collectives beyond allreduce, through real jobs (scripts/collectives_checks.py).

The two usual layouts, and four ranks on two machines of two whose servers
share no memory with them (``BYTEPS_ENABLE_IPC=0``: TCP only, as servers on
hosts of their own), where the process-set checks span machines and a rank
outside a set proves that the set never waits for it.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from byteps.common.frontend.collectives import Piece
from byteps.testkit import JOB_LAYOUTS, assert_all_ok, launch_job
from byteps.torch.collectives import _tensor

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")
CHECKS = 14


@pytest.mark.parametrize("layout", JOB_LAYOUTS)
def test_collectives_under_bpslaunch(layout, tmp_path):
    result = launch_job(JOB_LAYOUTS[layout], os.path.join(SCRIPTS, "collectives_checks.py"),
                        env={"BYTEPS_TEST_TMP": str(tmp_path)})
    assert_all_ok(result, checks=CHECKS)


def test_collectives_on_four_ranks_of_two_machines(tmp_path):
    marker = tmp_path / "members-finished"
    result = launch_job(["--workers", "2", "-np", "2", "--servers", "2"],
                        os.path.join(SCRIPTS, "collectives_checks.py"),
                        env={"OUTSIDER_FILE": str(marker), "BYTEPS_TEST_TMP": str(tmp_path), "BYTEPS_ENABLE_IPC": "0"},
                        timeout=180)
    assert_all_ok(result, checks=CHECKS, ranks=4)
    assert marker.exists()


def test_a_result_becomes_a_tensor_without_a_copy_when_aligned():
    buffer = np.arange(8, dtype=np.float32)
    raw = buffer.view(np.uint8)
    aligned = _tensor(Piece(raw[4:28], (2, 3), "torch.float32"), torch.float32, torch.device("cpu"))
    assert aligned.data_ptr() == raw[4:].ctypes.data  # the tensor is the piece's memory
    assert aligned.tolist() == [[1, 2, 3], [4, 5, 6]]
    # float64 at a 4-byte offset is misaligned: copied, with the same values
    wide = np.arange(3, dtype=np.float64).view(np.uint8)
    shifted = np.zeros(28, dtype=np.uint8)
    shifted[4:28] = wide
    copied = _tensor(Piece(shifted[4:28], (3,), "torch.float64"), torch.float64, torch.device("cpu"))
    assert copied.data_ptr() != shifted[4:].ctypes.data
    assert copied.tolist() == [0.0, 1.0, 2.0]
