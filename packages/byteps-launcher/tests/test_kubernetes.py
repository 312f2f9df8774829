"""bpslaunch kubernetes: manifests checked against the Kubernetes API's models and against byteps' own config,
and every container's command run as a local process, the pods started in every order.

No cluster runs here (docs/clusters.md says so): every object must
deserialize into the official client's model of its kind and serialize back
unchanged (a misspelled or misplaced field would be dropped), and every
pod's environment, with the values Kubernetes would fill in, must be one
that bpslaunch's role mode accepts.

The pods as processes: each "pod" is its container's command with the
environment its manifest gives it, its own address (127.0.0.x as its pod
IP) and a mount namespace of its own (``unshare --mount``) in which a hosts
file the test writes is bind-mounted over /etc/hosts, so the Service's name
resolves through glibc as cluster DNS would answer it, and only once the
scheduler's "pod" exists, as a headless Service publishes it. Needs root
(CI and tests-launcher run as root).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
from kubernetes import client

from byteps.launcher.kubernetes import BACKOFF_LIMIT, SCHEDULER_PORT, manifests
from byteps.launcher.role_mode import role_plan
from byteps.testkit import clean_env, kill_group, processes_with_variable

HERE = os.path.dirname(os.path.abspath(__file__))
needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="pods as processes need root (a mount namespace per pod)")

MODELS = {"Secret": "V1Secret", "Service": "V1Service", "Job": "V1Job"}


def generate(*args):
    done = subprocess.run([sys.executable, "-m", "byteps.launcher", "kubernetes", *args], capture_output=True,
                          text=True, timeout=60)
    return done


def test_every_object_is_a_valid_kubernetes_object_that_round_trips():
    done = generate("--name", "digits", "--image", "registry.example/train:1", "--workers", "4", "--servers", "2",
                    "--local-size", "2", "--gpus", "2", "-e", "OMP_NUM_THREADS=4", "--", "python", "train.py")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["kind"] == "List"
    api = client.ApiClient()
    kinds = [item["kind"] for item in document["items"]]
    assert kinds == ["Secret", "Service", "Job", "Job", "Job"]
    for item in document["items"]:
        model = api.deserialize(json.dumps(item), MODELS[item["kind"]], "application/json")
        assert api.sanitize_for_serialization(model) == item, item["metadata"]["name"]


def pod_environment(job, index, pod_ip=None):
    """A pod's environment as Kubernetes would fill it in (secret, pod IP, completion index)."""
    env = {}
    for variable in job["spec"]["template"]["spec"]["containers"][0]["env"]:
        if "value" in variable:
            env[variable["name"]] = variable["value"]
        elif "secretKeyRef" in variable["valueFrom"]:
            env[variable["name"]] = "s" * 64
        elif variable["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP":
            env[variable["name"]] = pod_ip or f"10.1.0.{index + 10}"
        else:
            assert "job-completion-index" in variable["valueFrom"]["fieldRef"]["fieldPath"]
            env[variable["name"]] = str(index)
    return env


def test_the_pods_are_wired_into_one_byteps_job():
    items = manifests("j1", "img", ["python", "train.py"], workers=3, servers=2, local_size=2)["items"]
    secret, service, scheduler, servers, workers = items
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"]
    assert service["spec"]["selector"] == scheduler["spec"]["template"]["metadata"]["labels"]
    assert (servers["spec"]["completions"], workers["spec"]["completions"]) == (2, 3)
    assert workers["spec"]["completionMode"] == "Indexed"
    for job in (scheduler, servers, workers):
        # A container that lost a start-up race comes back in its pod (same IP, same index).
        assert job["spec"]["backoffLimit"] == BACKOFF_LIMIT >= 1
        assert job["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure"
    # Every pod's environment makes a valid role-mode plan: the scheduler, the servers, each worker pod.
    plan = role_plan([], pod_environment(scheduler, 0))
    assert [p.role for p in plan.processes] == ["scheduler"]
    assert plan.processes[0].config().root_uri == service["metadata"]["name"]
    for index in range(3):
        command = workers["spec"]["template"]["spec"]["containers"][0]["command"]
        plan = role_plan(command[command.index("--") + 1:], pod_environment(workers, index))
        assert [(p.role, p.rank) for p in plan.processes] == [("worker", 2 * index), ("worker", 2 * index + 1)]
    assert role_plan([], pod_environment(servers, 1)).processes[0].role == "server"
    # The secret is referenced, never written into a pod's command or value.
    text = json.dumps([scheduler, servers, workers])
    assert secret["stringData"]["BYTEPS_JOB_SECRET"] not in text


@pytest.mark.parametrize("args,fragment", [
    (["--name", "Bad_Name", "--image", "i", "--workers", "1", "--servers", "1", "--", "x"], "--name 'Bad_Name'"),
    (["--image", "i", "--workers", "0", "--servers", "1", "--", "x"], "at least 1"),
    (["--image", "i", "--workers", "1", "--servers", "1"], "COMMAND are required"),
])
def test_bad_arguments_are_refused(args, fragment):
    done = generate(*args)
    assert done.returncode == 2 and fragment in done.stderr, done.stderr


class Pods:
    """The containers of one job's manifests run as local processes (see the module docstring)."""

    def __init__(self, folder, name, workers=2, servers=1):
        self.name = name
        self.items = manifests(name, "img", ["python", os.path.join(HERE, "kubernetes_pod_worker.py")],
                               workers=workers, servers=servers)["items"]
        self.service = self.items[1]["metadata"]["name"]
        self.jobs = {job["metadata"]["labels"]["byteps-role"]: job for job in self.items[2:]}
        self.hosts = folder / "hosts"
        self.hosts.write_text("127.0.0.1 localhost\n")
        self.folder = folder
        self.pods = {}  # (role, index) -> Popen
        self.addresses = {}
        self.envs = {}
        self.restarts = {}
        self.job_id = self.jobs["worker"]["spec"]["template"]["spec"]["containers"][0]["env"][4]["value"]

    def start(self, role, index=0, **extra):
        """Start (or restart, with the same IP and environment, as restartPolicy OnFailure does) one pod."""
        address = self.addresses.setdefault((role, index), f"127.0.{10 + len(self.addresses)}.{index + 2}")
        job = self.jobs[role]
        container = job["spec"]["template"]["spec"]["containers"][0]
        argv = [sys.executable if part == "python" else part for part in container["command"]]
        env = self.envs.setdefault((role, index), clean_env({**pod_environment(job, index, address),
                                                             "OMP_NUM_THREADS": "1", "BYTEPS_LOG_LEVEL": "INFO",
                                                             **extra}))
        with open(self.folder / f"{role}-{index}.log", "a") as log:
            self.pods[(role, index)] = subprocess.Popen(
                ["unshare", "--mount", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(self.hosts),
                 *argv], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return self.pods[(role, index)]

    def log(self, role, index=0):
        path = self.folder / f"{role}-{index}.log"
        return path.read_text() if path.exists() else ""

    def wait_for_line(self, role, text, timeout_s=30):
        deadline = time.monotonic() + timeout_s
        while text not in self.log(role) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert text in self.log(role), self.output()

    def publish_service(self):
        """What cluster DNS does for a headless Service once its pod has an IP (written in place: the
        pods' bind mounts see the same file)."""
        with open(self.hosts, "a") as f:
            f.write(f"{self.addresses[('scheduler', 0)]} {self.service}\n")

    def output(self):
        return "".join(f"--- {path.name}\n{path.read_text()[-1500:]}" for path in sorted(self.folder.glob("*.log")))

    def wait(self, timeout_s):
        """Until every pod exited 0 (or timeout_s), restarting a pod that failed up to BACKOFF_LIMIT times, as
        the kubelet does under restartPolicy OnFailure; the pods' last exit statuses."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            codes = {key: pod.poll() for key, pod in self.pods.items()}
            for key, code in codes.items():
                if code not in (None, 0) and self.restarts.get(key, 0) < BACKOFF_LIMIT:
                    self.restarts[key] = self.restarts.get(key, 0) + 1
                    self.start(*key)
                    codes[key] = None
            if all(code is not None for code in codes.values()):
                return codes
            time.sleep(0.1)
        return {key: pod.poll() for key, pod in self.pods.items()}

    def close(self):
        for pod in self.pods.values():
            if pod.poll() is None:
                kill_group(pod.pid)
                pod.wait()
        for pid in processes_with_variable("BYTEPS_JOB_ID", self.job_id):
            kill_group(pid)


@pytest.fixture
def pods(tmp_path, request):
    made = []

    def make(name):
        folder = tmp_path / name
        folder.mkdir()
        made.append(Pods(folder, name))
        return made[-1]

    yield make
    for job in made:
        job.close()


def assert_completed(job, timeout_s=90, restarts=None):
    codes = job.wait(timeout_s)
    assert all(code == 0 for code in codes.values()), f"{codes}\n{job.output()}"
    assert job.restarts == (restarts or {}), f"{job.restarts}\n{job.output()}"
    sums = sorted(re.findall(r"POD SUM \d+ \S+", job.output()))
    assert sums == ["POD SUM 0 3", "POD SUM 1 3"], job.output()
    assert processes_with_variable("BYTEPS_JOB_ID", job.job_id) == []


# The three rotations: every role starts first once and last once, the scheduler last included (all six
# orders took twice the CI minutes).
ORDERS = [("scheduler", "server", "workers"), ("server", "workers", "scheduler"), ("workers", "scheduler", "server")]


@needs_root
@pytest.mark.parametrize("order", ORDERS, ids="-".join)
def test_the_pods_start_in_any_order_and_the_job_completes(pods, order):
    """Each role's pods start a second after the previous role's; the Service's name is published only once the
    scheduler said it waits for it (a headless Service's DNS lags its pod). No pod may need a restart."""
    job = pods(f"k{os.getpid()}-{''.join(role[:2] for role in order)}")
    for role in order:
        if role == "workers":
            job.start("worker", 0), job.start("worker", 1)
        else:
            job.start(role)
        if role == "scheduler":
            job.wait_for_line("scheduler", f"waiting for DMLC_PS_ROOT_URI='{job.service}' to resolve")
            job.publish_service()
        time.sleep(1)
    assert_completed(job)


@needs_root
def test_a_pod_restarted_after_losing_a_race_rejoins_the_job(pods):
    """Worker pod 1 (BYTEPS_RENDEZVOUS_TIMEOUT=3) gives up on a scheduler that is not there yet and exits 1;
    restarted in its pod (same IP and environment, restartPolicy OnFailure), it joins the job, which completes."""
    job = pods(f"k{os.getpid()}-restart")
    job.start("worker", 0)
    lost = job.start("worker", 1, BYTEPS_RENDEZVOUS_TIMEOUT="3")
    assert lost.wait(60) != 0, job.output()
    job.restarts[("worker", 1)] = 1
    job.start("worker", 1)
    job.start("scheduler")
    job.wait_for_line("scheduler", "to resolve")
    job.publish_service()
    job.start("server")
    assert_completed(job, restarts={("worker", 1): 1})
    assert "scheduler" in job.log("worker", 1).split("bpslaunch: job failed")[0], job.log("worker", 1)


@needs_root
def test_a_scheduler_whose_name_never_resolves_says_what_it_waits_for_and_gives_up(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n")
    env = clean_env({"DMLC_ROLE": "scheduler", "DMLC_PS_ROOT_URI": "nowhere-scheduler",
                     "DMLC_PS_ROOT_PORT": str(SCHEDULER_PORT), "DMLC_NUM_WORKER": "1", "DMLC_NUM_SERVER": "1",
                     "BYTEPS_RENDEZVOUS_TIMEOUT": "7"})
    started = time.monotonic()
    done = subprocess.run(["unshare", "--mount", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts),
                           sys.executable, "-m", "byteps.server"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert 7 <= time.monotonic() - started < 30
    assert "waiting for DMLC_PS_ROOT_URI='nowhere-scheduler' to resolve" in done.stderr, done.stderr
    assert "DMLC_PS_ROOT_URI='nowhere-scheduler' did not resolve within BYTEPS_RENDEZVOUS_TIMEOUT=7 s" in done.stderr
