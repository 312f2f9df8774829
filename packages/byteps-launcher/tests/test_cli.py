"""bpslaunch's command line: usage and configuration errors exit 2 with a clear message."""

from __future__ import annotations

import pytest
from launcher_harness import ROLE_WORKER_ENV


def test_help_exits_0(job):
    rc, out, _ = job.run(["--help"])
    assert rc == 0 and "COMMAND" in out and "--grace-period" in out


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "missing COMMAND"),
        (["--"], "missing COMMAND"),
        (["-np", "0", "true"], "-np must be >= 1"),
        (["--workers", "0", "true"], "--workers must be >= 1"),
        (["--workers", "2", "--servers", "0", "true"], "--servers >= 1"),
        (["--servers", "1", "true"], "--servers needs a distributed job"),
        (["-np", "x", "true"], "invalid int value"),
        (["--grace-period", "-1", "true"], "must be a finite number >= 0"),
    ],
)
def test_usage_errors(job, args, message):
    rc, out, err = job.run(args)
    assert rc == 2
    assert message in err
    assert err.count("\n") == 1 and err.startswith("bpslaunch: error: ") and "(see bpslaunch --help)" in err
    assert out == ""


def test_unknown_flag_is_one_line_naming_it(job):
    rc, out, err = job.run(["--wrokers", "2", "true"])
    assert (rc, out) == (2, "")
    assert err == "bpslaunch: error: unrecognized arguments: --wrokers (see bpslaunch --help)\n"


@pytest.mark.parametrize(
    "env, variable",
    [
        ({"DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "2"}, "DMLC_WORKER_ID"),
        ({"DMLC_ROLE": "worker", "BYTEPS_LOCAL_SIZE": "abc"}, "BYTEPS_LOCAL_SIZE"),
        ({"DMLC_ROLE": "scheduler"}, "DMLC_PS_ROOT_URI"),
        ({"DMLC_ROLE": "janitor"}, "DMLC_ROLE"),
        ({"BYTEPS_LOG_LEVEL": "loud"}, "BYTEPS_LOG_LEVEL"),  # embedded mode checks knobs too
        ({"BYTEPS_FORCE_DISTRIBUTED": "maybe"}, "BYTEPS_FORCE_DISTRIBUTED"),
    ],
)
def test_config_errors_name_the_variable(job, env, variable):
    rc, out, err = job.run(["true"], env=job.env(**env))
    assert rc == 2
    assert f"bpslaunch: configuration error: {variable}:" in err
    assert out == ""


def test_role_mode_worker_needs_a_command(job):
    rc, _, err = job.run([], env=job.env(DMLC_ROLE="worker"))
    assert rc == 2 and "missing COMMAND" in err


def test_role_mode_rejects_embedded_options(job):
    rc, _, err = job.run(["-np", "2", "true"], env=job.env(**ROLE_WORKER_ENV))
    assert rc == 2 and "-np only apply in embedded mode" in err


def test_command_not_found_exits_127(job):
    rc, _, err = job.run(["/nonexistent/train"])
    assert rc == 127
    assert "worker 0 (local rank 0) could not be started" in err and "/nonexistent/train" in err


def test_stale_variables_are_reported_in_embedded_mode(job):
    rc, _, err = job.run(["true"], env=job.env(DMLC_NUM_WORKER="4"))
    assert rc == 0
    assert "ignoring DMLC_NUM_WORKER='4'" in err


def test_the_plan_is_printed_unless_quiet(job):
    rc, _, err = job.run(["true"])
    assert rc == 0 and "bpslaunch: embedded job: 1 worker process, no scheduler or servers" in err
    rc, _, err = job.run(["-q", "true"])
    assert (rc, err) == (0, "")
