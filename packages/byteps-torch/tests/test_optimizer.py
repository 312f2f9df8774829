"""DistributedOptimizer under the real launcher, one job per layout.

The checks themselves (scripts/optimizer_checks.py) compare every
rank's parameters after a distributed step with plain SGD on the averaged
gradients, which each rank recomputes from all ranks' data.
"""

import pytest
from job_checks import LAYOUTS, ScriptJobs

CHECKS = [
    "average_overlaps_backward",        # push_pulls start during backward; averages are right
    "backward_passes_per_step",         # local accumulation, then one push_pull; a third pass raises
    "skip_synchronize_with_clipping",   # synchronize(); clip; skip_synchronize(): step()
    "fp16_compression",                 # within float16 tolerance, and really rounded
    "requires_grad_changes",            # frozen from the start, unfrozen later, frozen later
    "unused_parameters",                # a branch used on one rank only: the others push zeros
    "predivide_and_sum",                # gradient_predivide_factor, op=Sum
    "errors",                           # duplicate / missing names, zero_grad while pending
    "wrapper_shares_state",             # subclass of the wrapped class, shared state, hooks once, schedulers
    "rewrapping_moves_hooks",           # a second wrapper of the same parameters takes their hooks over
    "fusion_matches_unfused",           # small gradients fused (1 or several buckets) = each sent alone
]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    return ScriptJobs("optimizer_checks.py", str(tmp_path_factory.mktemp("optimizer")))


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("check", CHECKS)
def test_optimizer(jobs, layout, check):
    jobs.assert_passed(layout, check)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_job_exits_cleanly(jobs, layout):
    result = jobs.result(layout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
