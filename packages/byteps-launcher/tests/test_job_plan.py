"""Planning without starting anything: who runs what, with which environment."""

from __future__ import annotations

import sys

import pytest
from launcher_harness import ROLE_WORKER_ENV

from byteps.common.config import ConfigError
from byteps.launcher.embedded_mode import EmbeddedOptions, embedded_plan, stale_variables
from byteps.launcher.job_plan import SERVER_ARGV, UsageError
from byteps.launcher.role_mode import role_plan
from byteps.testkit import clean_env

CMD = ["python", "train.py"]


def plan(port=5555, env=None, **options):
    return embedded_plan(EmbeddedOptions(**options), CMD, clean_env(env), port=port)


def test_single_worker_is_not_distributed():
    job = plan()
    assert [p.label for p in job.processes] == ["worker 0 (local rank 0)"]
    assert not job.distributed
    env = job.processes[0].env
    assert env["DMLC_ROLE"] == "worker" and env["BYTEPS_LOCAL_RANK"] == "0"
    assert env["BYTEPS_LOCAL_SIZE"] == "1" and env["DMLC_NUM_WORKER"] == "1"
    assert "DMLC_PS_ROOT_PORT" not in env
    assert env["PYTHONUNBUFFERED"] == "1"
    assert job.processes[0].argv == tuple(CMD)


def test_two_workers_get_scheduler_and_two_servers():
    job = plan(num_worker=2)
    assert [p.label for p in job.processes] == [
        "scheduler", "server 0", "server 1", "worker 0 (local rank 0)", "worker 1 (local rank 0)",
    ]
    assert [p.prefix for p in job.processes] == [
        "[scheduler] ", "[server 0] ", "[server 1] ", "[worker 0] ", "[worker 1] ",
    ]
    for process in job.processes:
        env = process.env
        assert env["DMLC_ROLE"] == process.role
        assert env["DMLC_PS_ROOT_URI"] == "127.0.0.1" and env["DMLC_PS_ROOT_PORT"] == "5555"
        assert env["DMLC_NUM_WORKER"] == "2" and env["DMLC_NUM_SERVER"] == "2"
        assert env["DMLC_INTERFACE"] == "lo" and env["DMLC_NODE_HOST"] == "127.0.0.1"
        assert "BYTEPS_FORCE_DISTRIBUTED" not in env
    for service in job.services:
        assert service.argv == SERVER_ARGV == (sys.executable, "-m", "byteps.server")
        assert "BYTEPS_LOCAL_RANK" not in service.env
    assert [p.env["DMLC_WORKER_ID"] for p in job.workers] == ["0", "1"]


def test_local_processes_of_one_machine_need_no_server_and_get_global_ranks():
    job = plan(local_size=3)  # local aggregation sums in shared memory
    assert [p.role for p in job.processes] == ["scheduler", "worker", "worker", "worker"]
    assert {p.env["DMLC_NUM_SERVER"] for p in job.processes} == {"0"}
    job_ids = {p.env["BYTEPS_JOB_ID"] for p in job.processes}
    assert len(job_ids) == 1 and job_ids != {""}  # one id per job names its shared memory
    assert [p.role for p in plan(local_size=3, num_server=1).processes].count("server") == 1
    job = plan(num_worker=2, local_size=2)
    workers = job.workers
    assert [(p.rank, p.local_rank, p.env["DMLC_WORKER_ID"]) for p in workers] == [
        (0, 0, "0"), (1, 1, "0"), (2, 0, "1"), (3, 1, "1"),
    ]
    assert all(p.env["BYTEPS_LOCAL_SIZE"] == "2" for p in workers)
    assert [p.label for p in workers][3] == "worker 3 (local rank 1)"
    assert workers[2].config().rank == 2


def test_force_distributed_from_flag_or_environment():
    for job in (plan(force_distributed=True), plan(env={"BYTEPS_FORCE_DISTRIBUTED": "1"})):
        assert job.distributed
        assert [p.role for p in job.processes] == ["scheduler", "server", "worker"]
        assert all(p.env["BYTEPS_FORCE_DISTRIBUTED"] == "1" for p in job.processes)


def test_explicit_servers():
    assert [p.role for p in plan(num_worker=3, num_server=None).processes].count("server") == 3
    assert [p.role for p in plan(num_worker=3, num_server=1).processes].count("server") == 1


@pytest.mark.parametrize(
    "options, message",
    [
        ({"local_size": 0}, "-np must be >= 1"),
        ({"num_worker": 0}, "--workers must be >= 1"),
        ({"num_worker": 2, "num_server": -1}, "--servers must be >= 0"),
        ({"num_worker": 2, "num_server": 0}, "needs --servers >= 1"),
        ({"num_server": 2}, "--servers needs a distributed job"),
    ],
)
def test_bad_sizes_are_usage_errors(options, message):
    with pytest.raises(UsageError, match=message):
        plan(**options)


def test_missing_command():
    with pytest.raises(UsageError, match="missing COMMAND"):
        embedded_plan(EmbeddedOptions(), [], clean_env())


def test_stale_topology_variables_are_replaced():
    env = {"DMLC_NUM_WORKER": "7", "BYTEPS_LOCAL_RANK": "5", "DMLC_PS_ROOT_PORT": "1"}
    assert sorted(stale_variables(clean_env(env))) == sorted(env)
    job = plan(env=env, num_worker=2)
    assert all(p.env["DMLC_NUM_WORKER"] == "2" for p in job.processes)
    assert all(p.env.get("BYTEPS_LOCAL_RANK") in (None, "0") for p in job.processes)


def test_bad_knob_in_embedded_mode_names_the_variable():
    with pytest.raises(ConfigError, match="BYTEPS_LOG_LEVEL"):
        plan(env={"BYTEPS_LOG_LEVEL": "loud"})


def test_unused_fields_stay_inherited():
    job = plan(env={"BYTEPS_PARTITION_BYTES": "1024", "SOMETHING": "x"}, num_worker=2)
    assert all(p.env["BYTEPS_PARTITION_BYTES"] == "1024" and p.env["SOMETHING"] == "x" for p in job.processes)


# ----------------------------------------------------------------- role mode


def test_role_worker_defaults_to_one_process():
    job = role_plan(CMD, clean_env({"DMLC_ROLE": "worker"}))
    assert [p.label for p in job.processes] == ["worker 0 (local rank 0)"]
    assert job.processes[0].env["BYTEPS_LOCAL_SIZE"] == "1"


def test_role_worker_spawns_local_size_processes():
    env = clean_env({**ROLE_WORKER_ENV, "DMLC_NUM_WORKER": "2", "DMLC_WORKER_ID": "1", "BYTEPS_LOCAL_SIZE": "3"})
    job = role_plan(CMD, env)
    assert [(p.rank, p.local_rank) for p in job.processes] == [(3, 0), (4, 1), (5, 2)]
    assert [p.env["BYTEPS_LOCAL_RANK"] for p in job.processes] == ["0", "1", "2"]
    assert all(p.env["DMLC_WORKER_ID"] == "1" and p.env["DMLC_PS_ROOT_PORT"] == "9" for p in job.processes)


@pytest.mark.parametrize("role", ["server", "scheduler"])
def test_role_server_and_scheduler_run_the_server(role):
    env = clean_env({**ROLE_WORKER_ENV, "DMLC_ROLE": role, "DMLC_NUM_WORKER": "2"})
    job = role_plan(CMD, env)
    (process,) = job.processes
    assert process.argv == SERVER_ARGV and process.role == role
    assert process.prefix == f"[{role}] "
    assert process.env["DMLC_ROLE"] == role


@pytest.mark.parametrize("given, expected", [(None, "1"), ("0", "0")])
def test_role_scheduler_lets_a_shutdown_leave_the_job_unless_told_otherwise(given, expected):
    extra = {} if given is None else {"BYTEPS_SHUTDOWN_LEAVES_JOB": given}
    (scheduler,) = role_plan(CMD, clean_env({**ROLE_WORKER_ENV, "DMLC_ROLE": "scheduler", **extra})).processes
    assert scheduler.env["BYTEPS_SHUTDOWN_LEAVES_JOB"] == expected
    (server,) = role_plan(CMD, clean_env({**ROLE_WORKER_ENV, "DMLC_ROLE": "server"})).processes
    assert "BYTEPS_SHUTDOWN_LEAVES_JOB" not in server.env  # only the scheduler decides


def test_role_worker_without_command():
    with pytest.raises(UsageError, match="missing COMMAND"):
        role_plan([], clean_env({"DMLC_ROLE": "worker"}))


@pytest.mark.parametrize(
    "env, variable",
    [
        ({"DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "2"}, "DMLC_WORKER_ID"),
        ({"DMLC_ROLE": "worker", "BYTEPS_LOCAL_SIZE": "abc"}, "BYTEPS_LOCAL_SIZE"),
        ({"DMLC_ROLE": "boss"}, "DMLC_ROLE"),
        ({"DMLC_ROLE": "server"}, "DMLC_PS_ROOT_URI"),
    ],
)
def test_role_config_errors_name_the_variable(env, variable):
    with pytest.raises(ConfigError, match=variable) as info:
        role_plan(CMD, clean_env(env))
    assert info.value.variable == variable


def test_the_plan_describes_itself_in_one_line():
    assert plan().describe() == "embedded job: 1 worker process, no scheduler or servers (one process needs none)"
    assert plan(num_worker=2, local_size=2, num_server=3).describe() == (
        "embedded job: scheduler on 127.0.0.1:5555, 3 servers, 4 worker processes (2 machines x 2), "
        "512000-byte partitions, TCP to the servers and shared memory inside a machine")
    assert plan(local_size=2, env={"BYTEPS_PARTITION_BYTES": "1000"}).describe() == (
        "embedded job: scheduler on 127.0.0.1:5555, 2 worker processes (1 machine x 2), "
        "1000-byte partitions, shared memory inside a machine")
    role_worker = role_plan(CMD, clean_env({**ROLE_WORKER_ENV, "DMLC_NUM_WORKER": "2", "DMLC_WORKER_ID": "1"}))
    assert role_worker.describe() == (
        "role mode (worker): scheduler at 127.0.0.1:9, 1 worker process on worker machine 1 of 2, "
        "512000-byte partitions, TCP to the servers")
    server = role_plan([], clean_env({**ROLE_WORKER_ENV, "DMLC_ROLE": "server", "DMLC_NUM_WORKER": "2"}))
    assert server.describe() == (
        "role mode (server): scheduler at 127.0.0.1:9, for 1 server and 2 worker machines, "
        "512000-byte partitions, TCP to the servers")


@pytest.mark.parametrize("role", ["scheduler", "server"])
def test_a_role_mode_service_of_one_forced_worker_does_not_say_it_needs_none(role):
    # BytePS's meta_test.py starts scheduler and server with DMLC_NUM_WORKER=1 and no BYTEPS_FORCE_DISTRIBUTED
    # (only its worker is forced); they are still the job's scheduler and server.
    env = clean_env({**ROLE_WORKER_ENV, "DMLC_ROLE": role, "DMLC_NUM_WORKER": "1"})
    text = role_plan([], env).describe()
    assert "needs none" not in text, text
    assert text.startswith(f"role mode ({role}): scheduler {'on' if role == 'scheduler' else 'at'} 127.0.0.1:9, ")
    assert text.endswith("for 1 server and 1 worker machine, 512000-byte partitions, TCP to the servers")
