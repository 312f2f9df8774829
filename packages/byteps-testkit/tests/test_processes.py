"""free_port, clean_env and process clean-up, on real processes."""

from __future__ import annotations

import socket
import subprocess
import sys

from byteps.testkit import (
    clean_env,
    free_port,
    is_alive,
    kill_group,
    process_state,
    processes_with_variable,
    unset_byteps_env,
    variable_of,
    wait_until_dead,
)


def test_free_port_can_be_bound_on_loopback():
    port = free_port()
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))
    assert 1024 <= port < 65536


def test_clean_env_drops_byteps_knobs_and_adds_extra(monkeypatch):
    for name in ("DMLC_ROLE", "BYTEPS_LOCAL_RANK", "PS_VERBOSE", "MXNET_ENGINE_TYPE"):
        monkeypatch.setenv(name, "x")
    monkeypatch.setenv("HOME_LIKE", "kept")
    env = clean_env({"BYTEPS_PARTITION_BYTES": "4000"}, drop=("MXNET_",))
    assert env["HOME_LIKE"] == "kept" and env["BYTEPS_PARTITION_BYTES"] == "4000"
    assert not {"DMLC_ROLE", "BYTEPS_LOCAL_RANK", "PS_VERBOSE", "MXNET_ENGINE_TYPE"} & set(env)
    assert "MXNET_ENGINE_TYPE" in clean_env()


def test_kill_group_takes_the_leader_and_its_background_child():
    leader = subprocess.Popen(["sh", "-c", "sleep 300 & echo $!; exec sleep 300"], start_new_session=True,
                              stdout=subprocess.PIPE)
    try:
        background = int(leader.stdout.readline())
        assert is_alive(background) and process_state(leader.pid) in ("S", "R")
        kill_group(leader.pid)
        leader.wait(timeout=5)
        assert wait_until_dead([background], timeout=5) == []
        kill_group(leader.pid)  # already gone: no error
    finally:
        kill_group(leader.pid)
        leader.wait()
        leader.stdout.close()


def test_a_zombie_is_dead_and_a_reaped_pid_has_no_state():
    child = subprocess.Popen(["true"])
    assert wait_until_dead([child.pid], timeout=5) == []  # a zombie until reaped
    child.wait()
    assert process_state(child.pid) is None and not is_alive(child.pid)


def test_unset_byteps_env_is_undone_by_monkeypatch(monkeypatch):
    import os

    monkeypatch.setenv("DMLC_ROLE", "worker")
    with monkeypatch.context() as scoped:
        unset_byteps_env(scoped)
        assert "DMLC_ROLE" not in os.environ
    assert os.environ["DMLC_ROLE"] == "worker"


def test_a_process_is_found_by_a_variable_and_its_variables_read():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             env=clean_env({"BYTEPS_JOB_ID": "findme123", "DMLC_ROLE": "server"}))
    try:
        assert processes_with_variable("BYTEPS_JOB_ID", "findme123") == [child.pid]
        assert variable_of(child.pid, "DMLC_ROLE") == "server"
        assert variable_of(child.pid, "DMLC_NUM_WORKER") == ""
    finally:
        child.kill()
        child.wait()
    assert variable_of(child.pid, "DMLC_ROLE") == "" and processes_with_variable("BYTEPS_JOB_ID", "findme123") == []
