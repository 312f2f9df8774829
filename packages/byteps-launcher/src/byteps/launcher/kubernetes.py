"""Kubernetes manifests for a byteps job: ``bpslaunch kubernetes --workers 4 --servers 4 --image IMG -- CMD``.

Prints one JSON ``List`` (``kubectl apply -f job.json``; JSON is YAML too)
of five objects, all named after ``--name`` and labelled ``byteps-job``:

* a ``Secret`` holding the job secret (``BYTEPS_JOB_SECRET``, generated),
  read by every pod through ``secretKeyRef``, never written in a command;
* a headless ``Service`` for the scheduler, publishing its address before
  it is ready (``publishNotReadyAddresses``), so ``DMLC_PS_ROOT_URI`` is
  the Service's DNS name from the first second;
* three ``Job`` objects, one per role, each pod running ``bpslaunch`` in
  role mode with ``DMLC_ROLE`` set: the scheduler (1 pod), the servers (an
  Indexed Job of K pods) and the workers (an Indexed Job of W pods, each
  ``DMLC_WORKER_ID`` = its completion index from the downward API, with
  ``--local-size L`` worker processes). Jobs rather than a Deployment or
  StatefulSet: byteps servers exit when every worker has finished, and a
  Deployment would restart them. ``ttlSecondsAfterFinished`` cleans up.
* ``DMLC_NODE_HOST`` is each pod's IP (downward API ``status.podIP``).

The pods may start in any order. A worker or server that starts before
the scheduler keeps connecting to the Service's name (ZeroMQ looks it up
again on every attempt); the scheduler looks its own name up until the
Service publishes it (``byteps-server``); nobody's rendezvous completes
until the scheduler has every server and every worker, so workers wait for
the servers without a readiness probe. A container that fails anyway (lost
a race we did not foresee, a node hiccup) is restarted in its pod
(``restartPolicy: OnFailure``, same IP and index) up to ``BACKOFF_LIMIT``
times before its Job fails; a restarted pod registers again and the job
goes on. A process that fails once training runs ends the job: the other
pods' heartbeats end them within seconds, as bpslaunch ends them on one
machine, and their restarts fail the Jobs once BACKOFF_LIMIT is spent.

Not run on a live cluster here: the tests check every object against the
Kubernetes API's models (the ``kubernetes`` client) and the wiring between
them, and run every container's command as a local process with the
environment its manifest gives it, the Service's name resolved through a
hosts file, started in every order; docs/clusters.md says what that leaves
unverified.

Example::

    bpslaunch kubernetes --workers 2 --servers 2 --image registry/byteps-train:1 -- python train.py > job.json
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import sys
from typing import Any, Dict, List, Optional, Sequence

__all__ = ["manifests", "main", "BACKOFF_LIMIT", "SCHEDULER_PORT"]

SCHEDULER_PORT = 9000
#: Restarts of a failed container before its Job fails (restartPolicy OnFailure).
BACKOFF_LIMIT = 4
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?")


def _env(name: str, value: str) -> Dict[str, Any]:
    return {"name": name, "value": value}


def _job(name: str, job: str, role: str, pods: int, image: str, command: List[str], env: List[Dict[str, Any]],
         indexed: bool, resources: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    labels = {"byteps-job": job, "byteps-role": role}
    container: Dict[str, Any] = {"name": role, "image": image, "command": command, "env": env}
    if role == "scheduler":
        container["ports"] = [{"containerPort": SCHEDULER_PORT, "name": "scheduler"}]
    if resources:
        container["resources"] = resources
    spec: Dict[str, Any] = {
        "completions": pods, "parallelism": pods, "backoffLimit": BACKOFF_LIMIT,
        "ttlSecondsAfterFinished": 600, "template": {"metadata": {"labels": labels},
                                                     "spec": {"restartPolicy": "OnFailure", "containers": [container]}},
    }
    if indexed:
        spec["completionMode"] = "Indexed"
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": labels}, "spec": spec}


def manifests(name: str, image: str, command: Sequence[str], workers: int, servers: int, local_size: int = 1,
              env: Optional[Dict[str, str]] = None, worker_resources: Optional[Dict[str, Any]] = None,
              secret: Optional[str] = None) -> Dict[str, Any]:
    """The job as one Kubernetes ``List``; ValueError naming the argument to fix."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"--name {name!r}: lower-case letters, digits and '-', at most 42 characters")
    if workers < 1 or servers < 1 or local_size < 1:
        raise ValueError("--workers, --servers and --local-size must be at least 1")
    if not image or not command:
        raise ValueError("--image and a COMMAND are required")
    service = f"{name}-scheduler"
    common = [
        _env("DMLC_PS_ROOT_URI", service), _env("DMLC_PS_ROOT_PORT", str(SCHEDULER_PORT)),
        _env("DMLC_NUM_WORKER", str(workers)), _env("DMLC_NUM_SERVER", str(servers)),
        _env("BYTEPS_JOB_ID", re.sub(r"[^A-Za-z0-9_.]", "_", name)[:40]),
        {"name": "BYTEPS_JOB_SECRET",
         "valueFrom": {"secretKeyRef": {"name": f"{name}-secret", "key": "BYTEPS_JOB_SECRET"}}},
        {"name": "DMLC_NODE_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        _env("PYTHONUNBUFFERED", "1"),
        *(_env(k, v) for k, v in sorted((env or {}).items())),
    ]
    bpslaunch = ["python", "-m", "byteps.launcher"]
    index = {"name": "DMLC_WORKER_ID", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}
    items = [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{name}-secret", "labels": {"byteps-job": name}},
         "type": "Opaque", "stringData": {"BYTEPS_JOB_SECRET": secret or secrets.token_hex(32)}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": service, "labels": {"byteps-job": name}},
         "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                  "selector": {"byteps-job": name, "byteps-role": "scheduler"},
                  "ports": [{"name": "scheduler", "port": SCHEDULER_PORT, "targetPort": SCHEDULER_PORT}]}},
        _job(f"{name}-scheduler", name, "scheduler", 1, image, bpslaunch,
             [*common, _env("DMLC_ROLE", "scheduler")], False, None),
        _job(f"{name}-server", name, "server", servers, image, bpslaunch, [*common, _env("DMLC_ROLE", "server")],
             True, None),
        _job(f"{name}-worker", name, "worker", workers, image, [*bpslaunch, "--", *command],
             [*common, _env("DMLC_ROLE", "worker"), index, _env("BYTEPS_LOCAL_SIZE", str(local_size))], True,
             worker_resources),
    ]
    return {"apiVersion": "v1", "kind": "List", "items": items}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="bpslaunch kubernetes", description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="byteps", help="prefix of every object's name (default byteps)")
    parser.add_argument("--image", required=True, help="container image with byteps and the training script")
    parser.add_argument("--workers", type=int, required=True, help="worker pods (DMLC_NUM_WORKER)")
    parser.add_argument("--servers", type=int, required=True, help="server pods (DMLC_NUM_SERVER)")
    parser.add_argument("--local-size", type=int, default=1, help="worker processes per worker pod")
    parser.add_argument("--gpus", type=int, default=0, help="nvidia.com/gpu per worker pod")
    parser.add_argument("-e", "--env", action="append", default=[], metavar="NAME=VALUE",
                        help="an extra variable for every pod (repeatable)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="what each worker process runs")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    extra = {}
    for item in args.env:
        key, equals, value = item.partition("=")
        if not equals or not key:
            parser.error(f"-e {item!r}: expected NAME=VALUE")
        extra[key] = value
    resources = {"limits": {"nvidia.com/gpu": str(args.gpus)}} if args.gpus else None
    try:
        document = manifests(args.name, args.image, command, args.workers, args.servers, args.local_size, extra,
                             resources)
    except ValueError as exc:
        print(f"bpslaunch kubernetes: error: {exc}", file=sys.stderr)
        return 2
    json.dump(document, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
