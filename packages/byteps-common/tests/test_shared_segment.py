"""SharedSegment: named per job, same size everywhere, gone after unlink or sweep."""

import os

import numpy as np
import pytest

from byteps.common.shared_segment import SHM_DIR, SharedSegment, segment_name, sweep


@pytest.fixture
def job_id():
    job = f"test{os.getpid()}"
    yield job
    sweep(job)


def test_two_mappings_of_one_name_share_memory_and_survive_unlink(job_id):
    name = segment_name(job_id, 1, 7)
    assert name == f"byteps-{job_id}-m1-t7"
    first = SharedSegment.open_or_create(name, 4096)
    second = SharedSegment.open_or_create(name, 4096)
    np.frombuffer(first.view, np.float32)[:] = 3.0
    first.unlink()
    assert not os.path.exists(os.path.join(SHM_DIR, name))
    assert np.all(np.frombuffer(second.view, np.float32) == 3.0)
    first.close()
    second.close()


def test_another_size_under_the_same_name_is_an_error(job_id):
    segment = SharedSegment.open_or_create(segment_name(job_id, 0, 0), 128)
    with pytest.raises(ValueError, match="has 128 bytes, this process needs 256"):
        SharedSegment.open_or_create(segment_name(job_id, 0, 0), 256)
    segment.close()


def test_jobs_do_not_share_names_and_sweep_removes_only_its_job(job_id):
    mine = SharedSegment.open_or_create(segment_name(job_id, 0, 1), 64)
    other = SharedSegment.open_or_create(segment_name(job_id + "b", 0, 1), 64)
    assert sweep(job_id) == [mine.name]
    assert os.path.exists(os.path.join(SHM_DIR, other.name))
    other.unlink()
    for segment in (mine, other):
        segment.close()


def test_a_segment_needs_a_positive_size(job_id):
    with pytest.raises(ValueError, match="positive size"):
        SharedSegment.open_or_create(segment_name(job_id, 0, 2), 0)
