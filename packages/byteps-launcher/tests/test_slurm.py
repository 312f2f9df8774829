"""bpslaunch under srun and sbatch, against a real two-node SLURM cluster (munged, slurmctld, two slurmd).

Each node is a network namespace of the test's with a slurmd of its own
(byteps.testkit.SlurmCluster(nodes=2)); srun and sbatch run here, the
tasks on the nodes, and every byteps address is a node's. The session
that runs these (`nox -s tests-engines`, as root) installs slurmctld,
slurmd, slurm-client and munge.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from launcher_harness import left_of_job, processes_of, running_worker_pids

from byteps.launcher.job_plan import UsageError
from byteps.launcher.slurm_mode import expand_nodelist, slurm_plan
from byteps.testkit import (
    SlurmCluster,
    clean_env,
    kill_group,
    rank_lines,
    slurm_available,
)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..", "..")
EXAMPLES = os.path.join(ROOT, "examples")
WORKER = os.path.join(HERE, "slurm_job_worker.py")

needs_slurm = pytest.mark.skipif(
    (not slurm_available() or os.geteuid() != 0 or shutil.which("ip") is None)
    and os.environ.get("BYTEPS_REQUIRE_ENGINES") != "1",
    reason="SLURM, root and ip netns are needed (nox -s tests-engines installs SLURM and runs as root)")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # Two GPUs per node, as SLURM counts them (no device here): a step that asks gets SLURM_GPUS_ON_NODE.
    with SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=2, gpus_per_node=2) as running:
        yield running



def environment(cluster):
    return clean_env({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **cluster.env})


def batch(cluster, args, env=None, timeout_s=300):
    """``sbatch ARGS`` and wait for the job's end; its state and exit code, as slurmctld reports them.

    Polled every 0.5 s: ``sbatch --wait`` polls at growing intervals and saw 12 s jobs end after 42 s."""
    submitted = subprocess.run(["sbatch", "--parsable", *args], env=env or environment(cluster), capture_output=True,
                               text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        shown = subprocess.run(["scontrol", "-o", "show", "job", job], env=environment(cluster), capture_output=True,
                               text=True, timeout=30).stdout
        state = re.search(r"JobState=(\S+)", shown).group(1)
        if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            return state, re.search(r" ExitCode=(\S+)", shown).group(1)
        time.sleep(0.5)
    subprocess.run(["scancel", job], env=environment(cluster))
    raise AssertionError(f"batch job {job} still running after {timeout_s} s")


def ran(output):
    """Each worker's line: {rank: (size, node, machine, local rank, local size, scheduler host, sum)}."""
    found = re.findall(r"RAN rank (\d+) of (\d+) on (\S+) machine (\d+) local (\d+) of (\d+) scheduler (\S+) "
                       r"sum (\S+)", output)
    return {int(r): (int(n), node, int(m), int(lr), int(ls), root, float(total))
            for r, n, node, m, lr, ls, root, total in found}


@needs_slurm
def test_srun_bpslaunch_trains_the_digits_example_on_two_nodes(cluster):
    pytest.importorskip("torch")
    result = subprocess.run(["srun", "-N2", "-n2", "--kill-on-bad-exit=1", sys.executable, "-m", "byteps.launcher",
                             "--", sys.executable, os.path.join(EXAMPLES, "torch", "train_digits.py"), "--epochs", "4",
                             "--min-accuracy", "0.85"], env=environment(cluster), capture_output=True, text=True,
                            timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "worker machine 0 of 2 (SLURM task 0)" in output and "worker machine 1 of 2 (SLURM task 1)" in output
    assert f"scheduler up on tcp://{cluster.addresses['n1']}:" in output, output[-3000:]
    assert "2 servers, 2 worker processes on 2 machines" in output, output[-3000:]
    text = "\n".join(rank_lines(result.stdout, 0))
    assert float(re.search(r"held-out accuracy (\S+)", text).group(1)) >= 0.85, text


@needs_slurm
def test_the_example_batch_script_runs_on_two_nodes(cluster, tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "job.out"
    env = {**environment(cluster), "PYTHON": sys.executable, "BYTEPS_EXAMPLES": os.path.abspath(EXAMPLES)}
    # As written: --nodes=2 --ntasks-per-node=1, each node a worker machine.
    state = batch(cluster, [f"--output={out}", os.path.join(EXAMPLES, "slurm", "train.sbatch")], env=env)
    text = out.read_text() if out.exists() else ""
    assert state == ("COMPLETED", "0:0"), f"{state}\n{text[-4000:]}"
    assert "2 servers, 2 worker processes on 2 machines" in text, text[-3000:]
    assert re.search(r"held-out accuracy 0\.\d+", text), text[-3000:]


@needs_slurm
def test_steps_of_a_batch_job_tasks_per_node_np_and_a_step_on_part_of_the_allocation(cluster, tmp_path):
    """One sbatch allocation of both nodes, three srun steps: --ntasks-per-node=2 (each node a machine of two
    processes), the same with -np 1 (-np wins: four machines), and a step on the second node only (-r1), whose
    scheduler must be on that node, not on the allocation's first."""
    script = tmp_path / "steps.sbatch"
    launch = f"{sys.executable} -m byteps.launcher"
    script.write_text("#!/bin/bash\nset -euo pipefail\n"
                      f"echo STEP per-node; srun -N2 --ntasks-per-node=2 {launch} -- {sys.executable} {WORKER}\n"
                      f"echo STEP np; srun -N2 --ntasks-per-node=2 {launch} -np 1 -- {sys.executable} {WORKER}\n"
                      f"echo STEP part; srun -N1 -n1 -r1 {launch} -- {sys.executable} {WORKER}\n")
    out = tmp_path / "steps.out"
    state = batch(cluster, ["-N2", "--ntasks-per-node=2", f"--output={out}", str(script)])
    text = out.read_text() if out.exists() else ""
    assert state == ("COMPLETED", "0:0"), f"{state}\n{text[-4000:]}"
    steps = dict(re.findall(r"STEP (\S+)\n(.*?)(?=STEP |\Z)", text, re.S))
    per_node, np_one, part = ran(steps["per-node"]), ran(steps["np"]), ran(steps["part"])
    # 2 machines x 2: ranks 0-1 on n1 (machine 0), 2-3 on n2; every process summed 1+2+3+4
    assert per_node == {r: (4, f"n{r // 2 + 1}", r // 2, r % 2, 2, "n1", 10.0) for r in range(4)}, steps["per-node"]
    # -np 1 wins over SLURM_NTASKS_PER_NODE: four machines of one process, two on each node
    assert sorted((node, m, lr, ls) for _, node, m, lr, ls, _, _ in np_one.values()) == \
        [("n1", 0, 0, 1), ("n1", 1, 0, 1), ("n2", 2, 0, 1), ("n2", 3, 0, 1)], steps["np"]
    assert {v[6] for v in np_one.values()} == {10.0}
    # the step runs on n2 only: its scheduler is there (the job's first node, n1, is not in the step)
    assert part == {0: (1, "n2", 0, 0, 1, "n2", 1.0)}, steps["part"]


@needs_slurm
def test_gpus_given_by_slurm_make_one_worker_per_gpu_on_each_node(cluster):
    result = subprocess.run(["srun", "-N2", "-n2", "--gpus-per-node=2", "--kill-on-bad-exit=1", sys.executable, "-m",
                             "byteps.launcher", "--", sys.executable, WORKER], env=environment(cluster),
                            capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    # SLURM_GPUS_ON_NODE=2: each task (node) a machine of two worker processes
    assert ran(output) == {r: (4, f"n{r // 2 + 1}", r // 2, r % 2, 2, "n1", 10.0) for r in range(4)}, output[-3000:]


@needs_slurm
def test_a_killed_worker_ends_the_job_non_zero_within_15_s_and_leaves_nothing_of_it(cluster):
    """Worker 1 (on node n2) is SIGKILLed mid-job: srun exits non-zero and no scheduler, server, worker or
    bpslaunch of the job is left on either node, all within 15 s of the kill (found by the job id in every
    process's environment)."""
    job_id = f"slurmkill{os.getpid()}"
    srun = subprocess.Popen(["srun", "-N2", "-n2", "--kill-on-bad-exit=1", sys.executable, "-m", "byteps.launcher",
                             "--grace-period", "2", "--", sys.executable, os.path.join(HERE, "ssh_job_worker.py")],
                            env={**environment(cluster), "BYTEPS_JOB_ID": job_id}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    try:
        pids = running_worker_pids(srun.stdout, lines, job_id)
        os.kill(pids[1], signal.SIGKILL)
        killed = time.monotonic()
        rest, _ = srun.communicate(timeout=30)
        ended = time.monotonic() - killed
        left = left_of_job(job_id, killed)
        output = "".join(lines) + rest
        print(f"srun ended {ended:.1f} s after the kill, the job's last process {time.monotonic() - killed:.1f} s")
        assert srun.returncode != 0, output
        assert ended < 15, output
        assert left == {}, f"processes of the job outlived it by 15 s: {left}\n{output[-3000:]}"
        assert "worker 1" in output and "was killed by SIGKILL" in output, output[-3000:]
    finally:
        if srun.poll() is None:
            os.killpg(srun.pid, signal.SIGKILL)
            srun.wait()
        for pid in processes_of(job_id):
            kill_group(pid)


def test_slurm_node_lists_expand():
    assert expand_nodelist("c[1-3,07],gpu1") == ["c1", "c2", "c3", "c07", "gpu1"]
    assert expand_nodelist("node5") == ["node5"]


def test_a_slurm_task_plans_its_share_of_the_job():
    environ = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "c[1-2]", "SLURM_JOB_ID": "77",
               "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "c2"}
    plan = slurm_plan(environ, ["python", "train.py"], local_size=2)
    assert [(p.role, p.rank) for p in plan.processes] == [("server", 1), ("worker", 2), ("worker", 3)]
    worker = plan.workers[0].env
    assert (worker["DMLC_PS_ROOT_URI"], worker["DMLC_NODE_HOST"], worker["DMLC_WORKER_ID"],
            worker["DMLC_NUM_WORKER"]) == ("c1", "c2", "1", "2")
    first = slurm_plan({**environ, "SLURM_PROCID": "0", "SLURMD_NODENAME": "c1"}, ["python", "train.py"])
    assert [p.role for p in first.processes] == ["scheduler", "server", "worker"]
    assert first.processes[0].env["DMLC_PS_ROOT_PORT"] == worker["DMLC_PS_ROOT_PORT"]


def test_the_scheduler_is_on_the_first_node_of_the_step_not_of_the_job():
    """A step on part of the allocation (srun -r1 -N1: node c2 only) must not look for the scheduler on c1."""
    environ = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NODELIST": "c[1-2]", "SLURM_STEP_NODELIST": "c2",
               "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "3", "SLURMD_NODENAME": "c2"}
    plan = slurm_plan(environ, ["python", "train.py"])
    assert {p.env["DMLC_PS_ROOT_URI"] for p in plan.processes} == {"c2"}
    # Without the step's list (an older srun), the job's.
    older = {k: v for k, v in environ.items() if k != "SLURM_STEP_NODELIST"}
    assert slurm_plan(older, ["python", "train.py"]).processes[0].env["DMLC_PS_ROOT_URI"] == "c1"


STEP = {"SLURM_NTASKS": "4", "SLURM_NNODES": "2", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NODELIST": "c[1-2]",
        "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0"}


def task(procid, node, local, **more):
    return {**STEP, "SLURM_PROCID": str(procid), "SLURM_NODEID": str(node), "SLURM_LOCALID": str(local),
            "SLURMD_NODENAME": f"c{node + 1}", **more}


def test_tasks_per_node_make_each_task_one_worker_process_of_its_node():
    """--ntasks-per-node=2 on 2 nodes: 2 machines x 2 processes; local task 0 runs the node's server."""
    plans = {procid: slurm_plan(task(procid, procid // 2, procid % 2, SLURM_NTASKS_PER_NODE="2"), ["t"])
             for procid in range(4)}
    roles = {procid: [(p.role, p.rank) for p in plan.processes] for procid, plan in plans.items()}
    assert roles == {0: [("scheduler", None), ("server", 0), ("worker", 0)], 1: [("worker", 1)],
                     2: [("server", 1), ("worker", 2)], 3: [("worker", 3)]}
    worker = plans[3].workers[0].env
    assert (worker["DMLC_NUM_WORKER"], worker["DMLC_WORKER_ID"], worker["BYTEPS_LOCAL_RANK"],
            worker["BYTEPS_LOCAL_SIZE"], worker["DMLC_NUM_SERVER"]) == ("2", "1", "1", "2", "2")
    assert "1 worker process here, on worker machine 1 of 2 (SLURM task 3)" in plans[3].describe()
    # The step's own count (SLURM's "2(x2)") reads the same, and wins over the batch script's inherited one.
    assert slurm_plan(task(3, 1, 1, SLURM_STEP_TASKS_PER_NODE="2(x2)"), ["t"]).workers[0].env["DMLC_WORKER_ID"] == "1"
    one = {**STEP, "SLURM_NTASKS": "1", "SLURM_STEP_NUM_NODES": "1", "SLURM_PROCID": "0", "SLURM_NODEID": "0",
           "SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "2", "SLURM_STEP_TASKS_PER_NODE": "1"}
    assert [(p.role, p.rank) for p in slurm_plan(one, ["t"]).processes] == [("scheduler", None), ("server", 0),
                                                                            ("worker", 0)]
    # Uneven tasks (3 on 2 nodes): every task a machine of its own, as without the variables.
    uneven = slurm_plan({**task(2, 1, 0), "SLURM_NTASKS": "3", "SLURM_STEP_TASKS_PER_NODE": "2,1"}, ["t"])
    assert [(p.role, p.rank) for p in uneven.processes] == [("server", 2), ("worker", 2)]


def test_gpus_on_the_node_give_one_worker_per_gpu_and_np_wins_over_every_variable():
    one_per_node = {**STEP, "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_NODEID": "1", "SLURM_LOCALID": "0",
                    "SLURMD_NODENAME": "c2", "SLURM_NTASKS_PER_NODE": "1"}
    assert len(slurm_plan(one_per_node, ["t"]).workers) == 1  # the default: one per task
    gpus = slurm_plan({**one_per_node, "SLURM_GPUS_ON_NODE": "4"}, ["t"])
    assert [(p.rank, p.env["BYTEPS_LOCAL_RANK"]) for p in gpus.workers] == [(4, "0"), (5, "1"), (6, "2"), (7, "3")]
    assert gpus.workers[0].env["BYTEPS_LOCAL_SIZE"] == "4"
    # -np wins over the GPUs and over the tasks per node: every task a machine of its own again.
    assert [p.rank for p in slurm_plan({**one_per_node, "SLURM_GPUS_ON_NODE": "4"}, ["t"], local_size=2).workers] \
        == [2, 3]
    per_task = slurm_plan(task(3, 1, 1, SLURM_NTASKS_PER_NODE="2", SLURM_GPUS_ON_NODE="2"), ["t"], local_size=1)
    assert [(p.role, p.rank) for p in per_task.processes] == [("server", 3), ("worker", 3)]
    assert per_task.workers[0].env["DMLC_NUM_WORKER"] == "4"


@pytest.mark.parametrize("change,fragment", [
    ({"SLURM_JOB_NODELIST": ""}, "SLURM_STEP_NODELIST and SLURM_JOB_NODELIST are not set"),
    ({"SLURM_NTASKS": "x"}, "SLURM_NTASKS='x'"),
    ({"SLURM_NTASKS_PER_NODE": "3", "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_LOCALID": "0"},
     "3 tasks per node on 1 nodes is not SLURM_NTASKS=2"),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x"}, "SLURM_STEP_TASKS_PER_NODE='2\\(x'"),
    ({"SLURM_GPUS_ON_NODE": "two"}, "SLURM_GPUS_ON_NODE='two'"),
])
def test_a_slurm_environment_without_what_it_needs_is_refused(change, fragment):
    environ = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "c1", "SLURM_JOB_ID": "7",
               "SLURM_STEP_ID": "0", **change}
    with pytest.raises(UsageError, match=fragment):
        slurm_plan(environ, ["python", "t.py"])
