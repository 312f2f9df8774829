"""bpslaunch kubernetes: manifests checked against the Kubernetes API's models and against byteps' own config.

No cluster runs here (docs/clusters.md says so): every object must
deserialize into the official client's model of its kind and serialize back
unchanged (a misspelled or misplaced field would be dropped), and every
pod's environment, with the values Kubernetes would fill in, must be one
that bpslaunch's role mode accepts.
"""

import json
import subprocess
import sys

import pytest
from kubernetes import client

from byteps.launcher.kubernetes import manifests
from byteps.launcher.role_mode import role_plan

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


def pod_environment(job, index):
    """A pod's environment as Kubernetes would fill it in (secret, pod IP, completion index)."""
    env = {}
    for variable in job["spec"]["template"]["spec"]["containers"][0]["env"]:
        if "value" in variable:
            env[variable["name"]] = variable["value"]
        elif "secretKeyRef" in variable["valueFrom"]:
            env[variable["name"]] = "s" * 64
        elif variable["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP":
            env[variable["name"]] = f"10.1.0.{index + 10}"
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
        assert job["spec"]["backoffLimit"] == 0
        assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
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
