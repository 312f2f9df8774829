"""broadcast_optimizer_state for every optimizer class in torch.optim, in one real 2-rank job.

scripts/optimizer_state_checks.py tries each optimizer and goes on past a
failing one; this test then lists every optimizer that failed on any rank,
or printed nothing, in one assertion.
"""

from __future__ import annotations

import os

import torch

from byteps.testkit import JOB_LAYOUTS, launch_job, rank_lines, report

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "optimizer_state_checks.py")


def torch_optimizers():
    return sorted(name for name, cls in vars(torch.optim).items()
                  if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)
                  and cls is not torch.optim.Optimizer)


def test_broadcast_optimizer_state_of_every_torch_optimizer():
    result = launch_job(JOB_LAYOUTS["one-machine-np2"], SCRIPT, timeout=300)
    failures = []
    for rank in (0, 1):
        results = {}
        for line in rank_lines(result.stdout, rank):
            if line.startswith("RESULT "):
                name, _, outcome = line[len("RESULT "):].partition(" ")
                results[name] = outcome
        for name in torch_optimizers():
            outcome = results.get(name, "no result (the job stopped before it)")
            if outcome != "ok":
                failures.append(f"rank {rank} {name}: {outcome}")
    assert not failures, "\n".join(failures) + "\n\n" + report(result)
    assert result.returncode == 0, report(result)
