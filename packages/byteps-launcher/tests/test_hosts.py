"""Host lists and the plan of a job over ssh, without starting anything."""

import pytest

from byteps.launcher.hosts import Host, parse_host_names, parse_hosts, read_hostfile
from byteps.launcher.job_plan import UsageError
from byteps.launcher.ssh import SshOptions, forwarded_environment, remote_argv, remote_request
from byteps.launcher.ssh_mode import ssh_plan


def test_horovod_host_syntax_and_hostfiles(tmp_path):
    assert parse_hosts("a:2,b:2") == [Host("a", 2), Host("b", 2)]
    assert parse_hosts("node1") == [Host("node1", 1)]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# cluster\nn1 slots=4\n\nn2:4  # second\n")
    assert read_hostfile(str(hostfile)) == [Host("n1", 4), Host("n2", 4)]
    assert parse_host_names("c1,c2", "--server-hosts") == ["c1", "c2"]


@pytest.mark.parametrize("text,fragment", [
    ("a:0", "has 0 slots"), ("a:-1", "has -1 slots"), ("a:two", "slots must be a whole number"),
    ("a:1,,b:1", "'' is not a host"), ("a:1,a:2", "names a twice"), ("a b:1", "is not a host"),
])
def test_malformed_host_lists_name_the_entry(text, fragment):
    with pytest.raises(UsageError, match=fragment):
        parse_hosts(text)


def test_a_missing_hostfile_says_so(tmp_path):
    with pytest.raises(UsageError, match="No such file"):
        read_hostfile(str(tmp_path / "none"))


def test_the_plan_gives_every_host_its_roles_and_remote_children_only_what_they_need():
    environ = {"PATH": "/here/only", "BYTEPS_PARTITION_BYTES": "65536", "BYTEPS_REPORT_DIR": "/tmp/x",
               "HOME": "/root", "MY_FLAG": "1"}
    plan = ssh_plan([Host("n1", 2), Host("n2", 2)], ["python", "train.py"], environ, num_server=2,
                    forward=["MY_FLAG"], port=9100)
    roles = [(p.role, p.host, p.rank) for p in plan.processes]
    assert roles[:3] == [("scheduler", "n1", None), ("server", "n1", 0), ("server", "n2", 1)]
    assert [(p.host, p.rank, p.local_rank) for p in plan.workers] == [("n1", 0, 0), ("n1", 1, 1), ("n2", 2, 0),
                                                                     ("n2", 3, 1)]
    worker = plan.workers[3].env
    assert (worker["DMLC_PS_ROOT_URI"], worker["DMLC_PS_ROOT_PORT"], worker["DMLC_WORKER_ID"],
            worker["DMLC_NODE_HOST"], worker["BYTEPS_LOCAL_SIZE"]) == ("n1", "9100", "1", "n2", "2")
    assert worker["BYTEPS_PARTITION_BYTES"] == "65536" and worker["MY_FLAG"] == "1"
    assert "PATH" not in worker and "HOME" not in worker and "BYTEPS_REPORT_DIR" not in worker
    assert len({p.env["BYTEPS_JOB_SECRET"] for p in plan.processes}) == 1
    # The secret travels on ssh's standard input, never on a command line.
    argv = remote_argv("n2", SshOptions(port=2222))
    assert "-p" in argv and "2222" in argv and not any(worker["BYTEPS_JOB_SECRET"] in a for a in argv)
    assert worker["BYTEPS_JOB_SECRET"].encode() in remote_request(["python", "train.py"], worker)


@pytest.mark.parametrize("kwargs,fragment", [
    ({"num_server": 3}, "--servers 3: between 1 and the 2 worker hosts"),
    ({"num_server": 1, "server_hosts": ["c1"]}, "not both"),
    ({"server_hosts": ["n2"]}, "also run workers"),
])
def test_server_placements_that_cannot_work_are_refused(kwargs, fragment):
    with pytest.raises(UsageError, match=fragment):
        ssh_plan([Host("n1", 1), Host("n2", 1)], ["python", "t.py"], {}, port=9100, **kwargs)


def test_dash_x_forwards_a_variable_or_refuses_an_unset_one():
    assert forwarded_environment({"A": "1", "OMP_NUM_THREADS": "2"}, ["A", "B=3"]) == \
        {"A": "1", "B": "3", "OMP_NUM_THREADS": "2"}
    with pytest.raises(UsageError, match="-x NOPE"):
        forwarded_environment({}, ["NOPE"])
