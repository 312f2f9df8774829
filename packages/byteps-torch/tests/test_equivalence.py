"""Two workers on halves of each batch train exactly as one process on the whole batch.

scripts/equivalence.py runs 20 steps of SGD with momentum on a
small CNN three ways (DistributedOptimizer, byteps' DistributedDataParallel,
torch's DistributedDataParallel with byteps_hook), each starting from
per-rank random weights, and compares with the single-process run it does
itself, within float32 tolerance.
"""

import re

import pytest
from job_checks import ScriptJobs

from byteps.testkit import JOB_LAYOUTS

WAYS = {
    "distributed_optimizer": "DistributedOptimizer",
    "byteps_ddp": "byteps DistributedDataParallel",
    "native_ddp_with_hook": "torch DistributedDataParallel with byteps_hook",
}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    return ScriptJobs("equivalence.py", str(tmp_path_factory.mktemp("equivalence")))


@pytest.mark.parametrize("layout", list(JOB_LAYOUTS))
@pytest.mark.parametrize("way", list(WAYS))
def test_equals_single_process(jobs, layout, way):
    for lines in jobs.assert_passed(layout, way):
        reports = [line for line in lines if line.startswith(WAYS[way] + ":")]
        assert len(reports) == 1, lines
        difference = float(re.search(r"reference (\S+)$", reports[0]).group(1))
        assert difference < 1e-5, reports[0]
