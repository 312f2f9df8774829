"""bpslaunch pins worker processes to CPUs (BYTEPS_NUMA_ON, BYTEPS_VISIBLE_CPU_CORES, ...).

The plan-level tests read a small sysfs tree written here (2 NUMA nodes of
4 CPUs, a GPU on each) and, for GPUs, a fake pynvml, since these machines
have none. The job-level tests run real bpslaunch jobs on this machine and
have every process print ``os.sched_getaffinity(0)``.
"""

from __future__ import annotations

import ast
import os
import time
from pathlib import Path

import pytest
from launcher_harness import PY, ROLE_WORKER_ENV, with_fake_server

from byteps.common.config import Config, ConfigError
from byteps.launcher.child_process import ChildProcess
from byteps.launcher.core_assignment import assign_cores
from byteps.launcher.cpu_placement import gpu_of, place_workers
from byteps.launcher.embedded_mode import EmbeddedOptions, embedded_plan
from byteps.launcher.job_plan import ProcessSpec
from byteps.launcher.role_mode import role_plan
from byteps.launcher.topology import read_topology

PRINT_AFFINITY = [PY, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
QUICK_SERVER = "import os; print(sorted(os.sched_getaffinity(0)))"
ALLOWED = sorted(os.sched_getaffinity(0))


def write_sysfs(root: Path) -> str:
    """Two NUMA nodes (CPUs 0-3 and 4-7, no hyperthreads), GPU 0 on node 0 and GPU 1 on node 1."""
    def put(path: str, text: str) -> None:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text + "\n")

    put("devices/system/cpu/online", "0-7")
    for cpu in range(8):
        put(f"devices/system/cpu/cpu{cpu}/topology/core_id", str(cpu % 4))
        put(f"devices/system/cpu/cpu{cpu}/topology/physical_package_id", str(cpu // 4))
        put(f"devices/system/cpu/cpu{cpu}/topology/thread_siblings_list", str(cpu))
    put("devices/system/node/node0/cpulist", "0-3")
    put("devices/system/node/node1/cpulist", "4-7")
    put("bus/pci/devices/0000:3b:00.0/numa_node", "0")
    put("bus/pci/devices/0000:af:00.0/numa_node", "1")
    return str(root)


class FakeNvml:
    """pynvml's calls used by read_gpus, for two GPUs (this machine has none)."""

    NVMLError = RuntimeError

    def nvmlInit(self): pass
    def nvmlShutdown(self): pass
    def nvmlDeviceGetCount(self): return 2
    def nvmlDeviceGetHandleByIndex(self, index): return index
    def nvmlDeviceGetUUID(self, handle): return f"GPU-{handle}aaa-fake"

    def nvmlDeviceGetPciInfo(self, handle):
        return type("PciInfo", (), {"busId": ["00000000:3B:00.0", "00000000:AF:00.0"][handle]})()


def local_plan(env=None, local_size=2):
    return embedded_plan(EmbeddedOptions(local_size=local_size), ["python", "train.py"], env or {}, port=1234)


# ------------------------------------------------------------------ plans


def test_workers_get_cores_near_their_gpu_and_services_stay_unpinned(tmp_path):
    lines = []
    plan = place_workers(local_plan(), sysfs_root=write_sysfs(tmp_path), nvml=FakeNvml(), allowed=range(8),
                         report=lines.append)
    assert [spec.cpus for spec in plan.workers] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert all(spec.cpus is None for spec in plan.services)
    assert "CPU placement (automatic)" in lines[1]
    assert "worker 1 (local rank 1): CPUs 4-7 (NUMA node 1, GPU 1)" in lines[-1]


def test_cuda_visible_devices_maps_local_ranks_to_gpus(tmp_path):
    plan = place_workers(local_plan({"CUDA_VISIBLE_DEVICES": "1,0", "BYTEPS_NUMA_DEFAULT_QUOTA": "2"}),
                         sysfs_root=write_sysfs(tmp_path), nvml=FakeNvml(), allowed=range(8))
    assert [spec.cpus for spec in plan.workers] == [(4, 5), (0, 1)]
    topo = read_topology(str(tmp_path), nvml=FakeNvml())
    spec = plan.workers[0]
    assert gpu_of(ProcessSpec("worker", (), {"CUDA_VISIBLE_DEVICES": "GPU-1aaa"}, local_rank=0), topo) == 1
    assert gpu_of(ProcessSpec("worker", (), {"CUDA_VISIBLE_DEVICES": "0"}, local_rank=1), topo) is None
    assert gpu_of(ProcessSpec("worker", (), {}, local_rank=5), topo) is None
    assert gpu_of(spec, topo) == 1



def test_nvidia_visible_devices_maps_local_ranks_unless_cuda_visible_devices_is_set(tmp_path):
    topo = read_topology(write_sysfs(tmp_path), nvml=FakeNvml())  # two GPUs

    def gpu(env, rank):
        return gpu_of(ProcessSpec("worker", (), env, local_rank=rank), topo)

    assert gpu({"NVIDIA_VISIBLE_DEVICES": "1,0"}, 0) == 1 and gpu({"NVIDIA_VISIBLE_DEVICES": "1,0"}, 1) == 0
    assert gpu({"NVIDIA_VISIBLE_DEVICES": "GPU-1aaa"}, 0) == 1
    assert gpu({"NVIDIA_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "0"}, 0) == 0  # CUDA's list wins
    assert gpu({"NVIDIA_VISIBLE_DEVICES": "all"}, 1) == 1
    assert gpu({"NVIDIA_VISIBLE_DEVICES": "none"}, 0) is None and gpu({"NVIDIA_VISIBLE_DEVICES": "void"}, 0) is None
    # inside the container the runtime made: NVML sees only the listed GPUs, numbered 0 and 1
    assert gpu({"NVIDIA_VISIBLE_DEVICES": "3,7"}, 1) == 1
    assert gpu({"CUDA_VISIBLE_DEVICES": "3,7"}, 1) == 7  # CUDA_VISIBLE_DEVICES is taken as it is, as before

def test_numa_off_and_server_roles_pin_nothing(tmp_path):
    root = write_sysfs(tmp_path)
    plan = place_workers(local_plan({"BYTEPS_NUMA_ON": "0"}), sysfs_root=root, allowed=range(8))
    assert all(spec.cpus is None for spec in plan.processes)
    server_env = {**ROLE_WORKER_ENV, "DMLC_ROLE": "server", "BYTEPS_VISIBLE_CPU_CORES": "0:1:2"}
    server = role_plan([], server_env)
    assert place_workers(server, sysfs_root=root, allowed=range(8)) is server


def test_unreadable_topology_leaves_workers_unpinned(tmp_path):
    lines = []
    plan = place_workers(local_plan(), sysfs_root=str(tmp_path), report=lines.append)
    assert all(spec.cpus is None for spec in plan.processes)
    assert "not pinned" in lines[0]


def test_bad_visible_cores_are_config_errors(tmp_path):
    root = write_sysfs(tmp_path)
    with pytest.raises(ConfigError, match="BYTEPS_VISIBLE_CPU_CORES: has 1 section but 2 local worker"):
        place_workers(local_plan({"BYTEPS_VISIBLE_CPU_CORES": "0-3"}), sysfs_root=root, allowed=range(8))
    with pytest.raises(ConfigError, match="names CPU 9, not online"):
        place_workers(local_plan({"BYTEPS_VISIBLE_CPU_CORES": "0:9"}), sysfs_root=root, allowed=range(8))


def test_a_cpu_that_cannot_be_pinned_is_a_warning_in_the_child():
    spec = ProcessSpec("worker", tuple(PRINT_AFFINITY), dict(os.environ), rank=0, local_rank=0, cpus=(100_000,))
    child = ChildProcess.spawn(spec)
    out, err = child.proc.communicate(timeout=20)
    assert child.proc.returncode == 0
    assert b"bpslaunch: could not pin to CPUs 100000" in err
    assert ast.literal_eval(out.decode()) == ALLOWED


# ------------------------------------------------------------ real jobs


def affinities(out: str) -> dict:
    found = {}
    for line in out.splitlines():
        prefix, _, rest = line.partition("] ")
        if rest.startswith("["):
            found[prefix + "]"] = ast.literal_eval(rest)
    return found


@pytest.mark.skipif(len(ALLOWED) < 2, reason="needs 2 CPUs")
def test_visible_cores_pin_each_worker(job):
    first, second = ALLOWED[:2]
    env = job.env(BYTEPS_VISIBLE_CPU_CORES=f"{second}:{first}")
    rc, out, err = job.run(["-np", "2", "--", *PRINT_AFFINITY], env=env, launcher=with_fake_server(QUICK_SERVER))
    assert rc == 0, err
    found = affinities(out)
    assert found["[worker 0]"] == [second] and found["[worker 1]"] == [first]
    assert found["[scheduler]"] == ALLOWED  # only workers are pinned


def test_automatic_placement_on_this_machine(job):
    rc, out, err = job.run(["-np", "2", "--", *PRINT_AFFINITY], launcher=with_fake_server(QUICK_SERVER))
    assert rc == 0, err
    found = affinities(out)
    expected = assign_cores(read_topology(gpus=False), Config(), workers=2, allowed=ALLOWED).cpus
    assert [tuple(found[f"[worker {r}]"]) for r in (0, 1)] == list(expected)
    if len(ALLOWED) >= 2 and expected[0] != expected[1]:
        assert not set(found["[worker 0]"]) & set(found["[worker 1]"])


def test_role_mode_workers_are_pinned_too(job):
    env = job.env(**ROLE_WORKER_ENV, BYTEPS_LOCAL_SIZE="2", BYTEPS_VISIBLE_CPU_CORES=f"{ALLOWED[0]}:{ALLOWED[-1]}")
    rc, out, err = job.run(PRINT_AFFINITY, env=env)
    assert rc == 0, err
    found = affinities(out)
    assert found["[worker 0]"] == [ALLOWED[0]] and found["[worker 1]"] == [ALLOWED[-1]]


def test_numa_off_leaves_workers_with_bpslaunchs_affinity(job):
    env = job.env(BYTEPS_NUMA_ON="0", BYTEPS_VISIBLE_CPU_CORES="0:0")
    rc, out, err = job.run(["-np", "2", "--", *PRINT_AFFINITY], env=env, launcher=with_fake_server(QUICK_SERVER))
    assert rc == 0, err
    assert all(cpus == ALLOWED for cpus in affinities(out).values())


@pytest.mark.parametrize("value, message", [
    ("0:0:0", "BYTEPS_VISIBLE_CPU_CORES: has 3 sections but 2 local worker processes"),
    ("0:4096", "BYTEPS_VISIBLE_CPU_CORES: section 1 names CPU 4096, not online on this machine"),
])
def test_bad_visible_cores_stop_bpslaunch_at_once(job, value, message):
    started = time.monotonic()
    rc, out, err = job.run(["-np", "2", "--", *PRINT_AFFINITY], env=job.env(BYTEPS_VISIBLE_CPU_CORES=value))
    assert rc == 2
    assert f"bpslaunch: configuration error: {message}" in err
    assert out == ""  # nothing was started
    assert time.monotonic() - started < 10
