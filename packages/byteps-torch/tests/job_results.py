"""Assertions on the output of a job run by torch_jobs.run_job."""

from __future__ import annotations

from torch_jobs import rank_lines

__all__ = ["assert_all_ok"]


def assert_all_ok(result, checks: int, ranks: int = 2) -> None:
    """The job exited 0 and every rank printed ``ALL OK <checks>``; else show what they printed."""
    report = f"exit {result.returncode}\n--- stdout\n{result.stdout[-6000:]}\n--- stderr\n{result.stderr[-4000:]}"
    assert result.returncode == 0, report
    for rank in range(ranks):
        assert f"ALL OK {checks}" in rank_lines(result.stdout, rank), report
