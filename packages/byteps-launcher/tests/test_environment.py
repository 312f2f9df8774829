"""The environment each child receives, in embedded and role mode, checked in real processes.

Embedded distributed jobs run with a stand-in server (``with_fake_server``)
that prints its environment and waits, so the contract is tested without
the real byteps.server; one last test runs the real one when installed.
"""

from __future__ import annotations

import importlib.util

import pytest
from launcher_harness import PRINT_ENV, PY, RECORD_PIDS, ROLE_WORKER_ENV, env_lines, with_fake_server

from byteps.testkit import wait_until_dead

# Prints its environment, then waits to be told to stop (a scheduler whose
# workers never connect).
WAITING_SERVER = "import json, os, time; print(json.dumps(dict(os.environ))); time.sleep(60)"
QUICK_SERVER = "import json, os; print(json.dumps(dict(os.environ)))"
TOPOLOGY = ("DMLC_ROLE", "DMLC_NUM_WORKER", "DMLC_NUM_SERVER", "DMLC_PS_ROOT_URI", "DMLC_INTERFACE", "DMLC_NODE_HOST")


def topology(env):
    return {name: env.get(name) for name in TOPOLOGY}


def test_single_worker_environment(job):
    rc, out, _ = job.run(PRINT_ENV, env=job.env(KEEP_ME="yes"))
    assert rc == 0
    envs = env_lines(out)
    assert list(envs) == ["[worker 0]"]
    env = envs["[worker 0]"]
    assert env["DMLC_ROLE"] == "worker" and env["DMLC_WORKER_ID"] == "0"
    assert env["BYTEPS_LOCAL_RANK"] == "0" and env["BYTEPS_LOCAL_SIZE"] == "1"
    assert env["DMLC_NUM_WORKER"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1" and env["KEEP_ME"] == "yes"
    assert "DMLC_PS_ROOT_PORT" not in env


def test_two_workers_default_to_two_servers(job):
    args = ["--workers", "2", "--grace-period", "0.5", "--", *PRINT_ENV]
    rc, out, err = job.run(args, launcher=with_fake_server(WAITING_SERVER))
    assert rc == 0, err
    envs = env_lines(out)
    assert sorted(envs) == ["[scheduler]", "[server 0]", "[server 1]", "[worker 0]", "[worker 1]"]
    ports = {env["DMLC_PS_ROOT_PORT"] for env in envs.values()}
    assert len(ports) == 1 and 1 <= int(ports.pop()) <= 65535
    for prefix, env in envs.items():
        role = prefix.strip("[]").split()[0]
        assert topology(env) == {
            "DMLC_ROLE": role, "DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "2",
            "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_INTERFACE": "lo", "DMLC_NODE_HOST": "127.0.0.1",
        }
        assert env["PYTHONUNBUFFERED"] == "1" and "BYTEPS_FORCE_DISTRIBUTED" not in env
    assert [envs[f"[worker {i}]"]["DMLC_WORKER_ID"] for i in (0, 1)] == ["0", "1"]
    assert all(envs[f"[worker {i}]"]["BYTEPS_LOCAL_SIZE"] == "1" for i in (0, 1))
    # The stand-in servers never exit by themselves: terminated, reported, job still succeeds.
    assert "still running 0.5 s after all workers finished; terminating" in err


def test_local_processes_of_one_machine_need_no_server(job):
    args = ["-np", "2", "--grace-period", "0.5", "--", *PRINT_ENV]
    rc, out, err = job.run(args, launcher=with_fake_server(QUICK_SERVER))
    assert rc == 0, err
    envs = env_lines(out)
    assert sorted(envs) == ["[scheduler]", "[worker 0]", "[worker 1]"]
    assert {env["DMLC_NUM_SERVER"] for env in envs.values()} == {"0"}
    assert len({env["BYTEPS_JOB_ID"] for env in envs.values()}) == 1
    workers = [envs["[worker 0]"], envs["[worker 1]"]]
    assert [(w["DMLC_WORKER_ID"], w["BYTEPS_LOCAL_RANK"], w["BYTEPS_LOCAL_SIZE"]) for w in workers] == [
        ("0", "0", "2"), ("0", "1", "2"),
    ]
    assert "still running" not in err  # these servers exit on their own


def test_force_distributed_single_worker(job):
    args = ["--force-distributed", "--grace-period", "0.5", "--", *PRINT_ENV]
    rc, out, err = job.run(args, launcher=with_fake_server(QUICK_SERVER))
    assert rc == 0, err
    envs = env_lines(out)
    assert sorted(envs) == ["[scheduler]", "[server 0]", "[worker 0]"]
    assert {env["BYTEPS_FORCE_DISTRIBUTED"] for env in envs.values()} == {"1"}
    assert {env["DMLC_NUM_WORKER"] for env in envs.values()} == {"1"}


def test_server_failure_tears_down_the_workers(job):
    server = "import os, sys, time; time.sleep(0.5); sys.exit(3 if os.environ['DMLC_ROLE'] == 'server' else 0)"
    args = ["--workers", "2", "--", "sh", "-c", RECORD_PIDS + "exec sleep 60"]
    rc, _, err = job.run(args, launcher=with_fake_server(server))
    assert rc == 3
    assert "exited with code 3; terminating" in err
    assert "server 0" in err or "server 1" in err
    assert wait_until_dead(job.pids(), timeout=1) == []


def test_role_mode_worker_environment(job):
    env = job.env(**ROLE_WORKER_ENV, DMLC_NUM_WORKER="2", DMLC_WORKER_ID="1", BYTEPS_LOCAL_SIZE="2", KEEP_ME="1")
    rc, out, err = job.run(PRINT_ENV, env=env)
    assert rc == 0, err
    envs = env_lines(out)
    assert sorted(envs) == ["[worker 2]", "[worker 3]"]
    for local_rank, prefix in enumerate(["[worker 2]", "[worker 3]"]):
        child = envs[prefix]
        assert child["BYTEPS_LOCAL_RANK"] == str(local_rank) and child["BYTEPS_LOCAL_SIZE"] == "2"
        for name, value in {**ROLE_WORKER_ENV, "DMLC_NUM_WORKER": "2", "DMLC_WORKER_ID": "1", "KEEP_ME": "1"}.items():
            assert child[name] == value
        assert child["PYTHONUNBUFFERED"] == "1"


def test_role_mode_worker_default_local_size(job):
    rc, out, _ = job.run(PRINT_ENV, env=job.env(DMLC_ROLE="worker"))
    assert rc == 0
    envs = env_lines(out)
    assert list(envs) == ["[worker 0]"]
    assert envs["[worker 0]"]["BYTEPS_LOCAL_SIZE"] == "1" and envs["[worker 0]"]["BYTEPS_LOCAL_RANK"] == "0"


@pytest.mark.parametrize("role", ["scheduler", "server"])
def test_role_mode_server_ignores_command(job, role):
    env = job.env(**{**ROLE_WORKER_ENV, "DMLC_ROLE": role}, DMLC_NUM_WORKER="2", KEEP_ME="1")
    rc, out, err = job.run(["echo", "never printed"], env=env, launcher=with_fake_server(QUICK_SERVER))
    assert rc == 0, err
    assert "never printed" not in out
    assert f"DMLC_ROLE={role}: COMMAND is ignored" in err
    envs = env_lines(out)
    assert list(envs) == [f"[{role}]"]
    child = envs[f"[{role}]"]
    for name, value in {**ROLE_WORKER_ENV, "DMLC_ROLE": role, "DMLC_NUM_WORKER": "2", "KEEP_ME": "1"}.items():
        assert child[name] == value
    assert "BYTEPS_LOCAL_RANK" not in child


def _real_server_available() -> bool:
    try:
        return importlib.util.find_spec("byteps.server.__main__") is not None
    except ImportError:
        return False


@pytest.mark.skipif(not _real_server_available(), reason="byteps.server.__main__ is not importable yet")
def test_embedded_job_with_the_real_server_starts_and_stops(job):
    # Workers that exit without connecting: the real scheduler and servers must
    # start, then be stopped by bpslaunch's post-worker grace period at the latest.
    args = ["--workers", "2", "--grace-period", "2", "--", PY, "-c", "print('ok')"]
    rc, out, err = job.run(args, timeout=30)
    assert rc == 0, err
    assert "[worker 0] ok" in out and "[worker 1] ok" in out


def test_role_mode_server_runs_until_it_exits(job):
    # No workers here: the post-worker grace period must not apply to a lone server.
    server = "import time; time.sleep(1.0); print('done')"
    env = job.env(**{**ROLE_WORKER_ENV, "DMLC_ROLE": "server"}, DMLC_NUM_WORKER="2")
    rc, out, err = job.run(["--grace-period", "0.2"], env=env, launcher=with_fake_server(server))
    assert rc == 0, err
    assert out == "[server] done\n"
    assert "still running" not in err


def test_role_mode_server_failure_is_the_exit_status(job):
    env = job.env(**{**ROLE_WORKER_ENV, "DMLC_ROLE": "scheduler"}, DMLC_NUM_WORKER="2")
    rc, _, err = job.run([], env=env, launcher=with_fake_server("raise SystemExit(5)"))
    assert rc == 5
    assert "bpslaunch: scheduler exited with code 5" in err
