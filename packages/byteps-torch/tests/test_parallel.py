"""byteps.torch.parallel under the real launcher: byteps' DistributedDataParallel and byteps_hook for torch's.

The checks (scripts/parallel_checks.py) compare every rank's
gradients after backward with the average of all ranks' gradients, which
each rank recomputes from all ranks' data.
"""

import pytest
from job_checks import ScriptJobs

from byteps.testkit import JOB_LAYOUTS

CHECKS = [
    "broadcast_at_construction",   # parameters and buffers from rank 0; broadcast_buffers=False keeps buffers
    "average_in_backward",         # averaged by the end of backward; buffers broadcast at forward
    "no_sync",                     # local accumulation, then one averaged pass
    "unused_parameters",           # a branch used on one rank only
    "requires_grad_changes",       # a parameter frozen at construction, unfrozen later
    "fp16_compression",
    "native_ddp_hook",             # torch's DDP + byteps_hook: averages, bucket rebuild, two models, no_sync
    "errors",
]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    return ScriptJobs("parallel_checks.py", str(tmp_path_factory.mktemp("parallel")))


@pytest.mark.parametrize("layout", list(JOB_LAYOUTS))
@pytest.mark.parametrize("check", CHECKS)
def test_parallel(jobs, layout, check):
    jobs.assert_passed(layout, check)
