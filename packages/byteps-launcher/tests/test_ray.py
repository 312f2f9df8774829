"""RayExecutor and BytePSTrainer against a real two-node Ray cluster (ray start --head, ray start --address).

The cluster lives in a network namespace the test creates (only its
loopback, so every Ray and byteps address is 127.0.0.1) and is stopped,
with the namespace, whatever happens. The session that runs these (`nox -s
tests-engines`) installs Ray from PyPI; they need root for the namespace.
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "ray_driver.py")
PORT = "26379"

needs_ray = pytest.mark.skipif(
    os.environ.get("BYTEPS_REQUIRE_ENGINES") != "1" and (shutil.which("ip") is None or os.geteuid() != 0),
    reason="needs root and ip netns (nox -s tests-engines)")


def in_namespace(namespace, *argv, timeout=180, **kwargs):
    return subprocess.run(["ip", "netns", "exec", namespace, *argv], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}, **kwargs)


@pytest.fixture(scope="module")
def ray_cluster():
    pytest.importorskip("ray")
    namespace = f"bpsray{os.getpid()}"
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    subprocess.run(["ip", "netns", "add", namespace], check=True)
    try:
        in_namespace(namespace, "ip", "link", "set", "lo", "up").check_returncode()
        head = in_namespace(namespace, ray, "start", "--head", f"--port={PORT}", "--num-cpus=2",
                            "--include-dashboard=false")
        assert head.returncode == 0, head.stdout + head.stderr
        second = in_namespace(namespace, ray, "start", f"--address=127.0.0.1:{PORT}", "--num-cpus=2")
        assert second.returncode == 0, second.stdout + second.stderr
        yield namespace
    finally:
        in_namespace(namespace, ray, "stop", "--force", timeout=60)
        subprocess.run(["ip", "netns", "del", namespace])


def drive(namespace, mode):
    return in_namespace(namespace, sys.executable, DRIVER, f"127.0.0.1:{PORT}", mode, timeout=240)


@needs_ray
def test_two_worker_actors_and_a_server_actor_train_the_digits(ray_cluster):
    pytest.importorskip("torch")
    result = drive(ray_cluster, "digits")
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    accuracies = [float(a) for a in re.search(r"ACCURACIES (.*)", result.stdout).group(1).split()]
    assert len(accuracies) == 2 and accuracies[0] == accuracies[1] >= 0.9, accuracies


@needs_ray
def test_a_killed_worker_actor_ends_run_with_rays_error_within_15_s(ray_cluster):
    result = drive(ray_cluster, "kill")
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    found = re.search(r"RAISED (\w+) after (\S+) s", result.stdout)
    assert found, result.stdout + result.stderr[-3000:]
    print(found.group(0))
    assert found.group(1) == "ActorDiedError" or "Actor" in found.group(1), found.group(0)
    assert float(found.group(2)) < 15
    # Nothing of the job on any node 15 s after the kill: found by its id (scheduler, server, and the actors,
    # whose processes Ray started with it)
    carrying = re.search(r"JOB PROCESSES (\d+) WORKERS CARRY THE ID (\w+)", result.stdout)
    assert carrying and int(carrying.group(1)) >= 4 and carrying.group(2) == "True", result.stdout
    assert "LEFT []" in result.stdout, result.stdout


@needs_ray
def test_a_cluster_without_enough_cpus_is_refused_before_anything_starts(ray_cluster):
    result = drive(ray_cluster, "cpus")
    assert "REFUSED the Ray cluster has 4 CPUs, this job asks for 10" in result.stdout, result.stdout + result.stderr


@needs_ray
def test_ray_trains_the_digits_with_the_byteps_backend(ray_cluster):
    pytest.importorskip("ray.train")
    result = drive(ray_cluster, "train")
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    found = re.search(r"ACCURACY (\S+)", result.stdout)
    assert found and float(found.group(1)) >= 0.9, (result.stdout + result.stderr)[-3000:]


@needs_ray
def test_a_failing_ray_train_worker_fails_the_run_and_stops_the_servers(ray_cluster):
    pytest.importorskip("ray.train")
    result = drive(ray_cluster, "train-fails")
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    found = re.search(r"FIT RAISED (\w+) after (\S+) s", result.stdout)
    assert found, (result.stdout + result.stderr)[-3000:]
    print(found.group(0))
    assert "rank 1 gives up" in result.stdout + result.stderr, result.stdout
    assert float(found.group(2)) < 15, found.group(0)  # from rank 1's raise to fit() raising
    assert "LEFT []" in result.stdout, result.stdout  # 15 s after the raise: no scheduler, server or worker


@needs_ray
def test_ray_train_servers_that_cannot_get_cpus_are_refused_not_waited_for(ray_cluster):
    pytest.importorskip("ray.train")
    result = drive(ray_cluster, "train-cpus")
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "FIT RAISED" in result.stdout, (result.stdout + result.stderr)[-3000:]
    output = result.stdout + result.stderr
    assert "the byteps servers ask for 3 (3 x 1)" in output, output[-3000:]
