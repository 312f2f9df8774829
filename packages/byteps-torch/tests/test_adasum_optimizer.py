"""DistributedOptimizer(op=Adasum) in real jobs (scripts/adasum_optimizer_checks.py).

Training is checked with 1 and 2 workers (one machine, and two machines
with two servers; 4 workers in matrix/test_adasum_four_workers.py, under
``nox -t matrix``) against a numpy Adasum of every rank's parameter
delta; the refusals that depend on the job (a non-power-of-two number of
workers, asynchronous training, backup workers, an elastic job) each in a
job of its own.
"""

from __future__ import annotations

import os

import pytest

from byteps.testkit import JOB_LAYOUTS, assert_all_ok, launch_job

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "adasum_optimizer_checks.py")
TRAINING_CHECKS = 10

TRAINING_JOBS = {
    "single-worker": ([], 1),
    **{name: (layout, 2) for name, layout in JOB_LAYOUTS.items()},
}

REFUSAL_JOBS = {
    "three-workers": (["-np", "3"], {}, 3),
    "async": (["--workers", "2", "--servers", "1"], {"BYTEPS_ENABLE_ASYNC": "1"}, 2),
    "backup-workers": (["--workers", "2", "--servers", "1"], {"BYTEPS_BACKUP_WORKERS": "1"}, 2),
    "elastic": (["-np", "2", "--min-np", "2"], {}, 2),
}


@pytest.mark.parametrize("job", list(TRAINING_JOBS))
def test_adasum_training_matches_numpy_reference(job):
    layout, ranks = TRAINING_JOBS[job]
    result = launch_job(layout, SCRIPT, timeout=240)
    assert_all_ok(result, checks=TRAINING_CHECKS, ranks=ranks)


@pytest.mark.parametrize("job", list(REFUSAL_JOBS))
def test_adasum_refused_by_the_job(job):
    layout, env, ranks = REFUSAL_JOBS[job]
    result = launch_job(layout, SCRIPT, env=env, timeout=240)
    assert_all_ok(result, checks=2, ranks=ranks)
