"""Driver of the Ray tests, run inside the test's network namespace against the Ray cluster started there.

Usage: python ray_driver.py ADDRESS digits|kill|cpus|train|train-fails|train-cpus
digits: 2 worker actors and 1 server actor train the digits model; prints each worker's accuracy.
kill:   the workers push_pull for up to 60 s; worker 1's actor is killed after 3 s; prints how long run()
        took to raise, and what, and which processes of the job (its BYTEPS_JOB_ID in their environment,
        or a worker actor's pid) were still alive 15 s after the kill.
cpus:   asks for more CPUs than the cluster has; prints the error.
train:  the same training through Ray Train (BytePSTrainer, 2 workers, 1 server); prints rank 0's accuracy.
train-fails: a Ray Train run whose rank 1 raises; prints the error fit() raised, how long after the raise,
        and the processes of the job still alive 15 s after the raise.
train-cpus: a Ray Train run whose servers ask for more CPUs than its workers left free; prints the error.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import ray

from byteps.launcher.ray_executor import RayExecutor


def train_digits(epochs: int) -> float:
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits

    import byteps.torch as bps

    bps.init()
    torch.manual_seed(0)
    digits = load_digits()
    images = torch.tensor(digits.images / 16.0, dtype=torch.float32).flatten(1)
    labels = torch.tensor(digits.target)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))  # the same on every worker
    images, labels = images[order], labels[order]
    train, test = slice(0, 1400), slice(1400, None)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05 * bps.size(), momentum=0.9),
                                         named_parameters=model.named_parameters())
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    mine = torch.arange(1400)[bps.rank()::bps.size()]
    for _ in range(epochs):
        for batch in mine.split(32):
            optimizer.zero_grad()
            F.cross_entropy(model(images[train][batch]), labels[train][batch]).backward()
            optimizer.step()
    accuracy = (model(images[test]).argmax(1) == labels[test]).float().mean().item()
    bps.shutdown()
    return accuracy


def push_pull_for(seconds: float) -> None:
    import numpy as np

    import byteps.common as bps

    bps.init()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        bps.push_pull(np.ones(1000, np.float32), name="x")
        time.sleep(0.05)
    bps.shutdown()


def train_loop(config: dict) -> float:
    import ray.train

    accuracy = train_digits(config["epochs"])
    ray.train.report({"accuracy": accuracy})  # Ray Train's own reporting works beside byteps
    return accuracy  # Ray Train hands rank 0's back as the result's return value


def failing_loop(config: dict) -> None:
    import numpy as np

    import byteps.common as bps

    bps.init()
    bps.push_pull(np.ones(10, np.float32), name="first")
    with open(os.path.join(config["notes"], f"pid-{bps.rank()}"), "w") as note:
        note.write(str(os.getpid()))
    if bps.rank() == 1:
        with open(os.path.join(config["notes"], "raised"), "w") as note:
            note.write(repr(time.time()))  # one machine: the driver reads the same wall clock
        raise RuntimeError("rank 1 gives up")
    push_pull_for(30)


def fit(loop, num_servers: int = 1) -> None:
    import tempfile

    from ray.train import RunConfig, ScalingConfig

    from byteps.launcher.ray_train import BytePSConfig, BytePSTrainer

    job_id = f"raytrain{os.getpid()}"
    notes = tempfile.mkdtemp(prefix="byteps-ray-train-notes")
    trainer = BytePSTrainer(loop, train_loop_config={"epochs": 10, "notes": notes},
                            scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
                            byteps_config=BytePSConfig(num_servers=num_servers, cpus_per_server=1,
                                                       env={"BYTEPS_JOB_ID": job_id}),
                            run_config=RunConfig(storage_path="/tmp/byteps-ray-train"))
    started = time.monotonic()
    try:
        result = trainer.fit()
        print(f"ACCURACY {result.return_value:.3f}", flush=True)
    except Exception as exc:  # noqa: BLE001 - what fit() raised is the point
        raised = os.path.join(notes, "raised")
        since = time.time() - float(open(raised).read()) if os.path.exists(raised) else time.monotonic() - started
        print(f"FIT RAISED {type(exc).__name__} after {since:.1f} s", flush=True)
        print(f"ERROR TEXT {str(exc)[:1000]!r}", flush=True)
        pids = [int(open(os.path.join(notes, name)).read()) for name in os.listdir(notes) if name.startswith("pid-")]
        print(f"LEFT {left_after(job_id, pids, 15 - since)}", flush=True)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def left_after(job_id: str, pids, seconds: float) -> list:
    """The processes of the job still alive after up to ``seconds``: those with ``BYTEPS_JOB_ID=job_id`` in their
    environment (scheduler, servers, and worker actors that carry it) and ``pids`` (workers known by pid)."""
    from byteps.testkit import processes_with_variable

    deadline = time.monotonic() + seconds
    while True:
        found = sorted(set(processes_with_variable("BYTEPS_JOB_ID", job_id)) | {p for p in pids if _alive(p)})
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def main() -> None:
    address, mode = sys.argv[1], sys.argv[2]
    ray.init(address=address, logging_level="ERROR", log_to_driver=mode != "kill")
    if mode in ("train", "train-fails", "train-cpus"):
        fit(failing_loop if mode == "train-fails" else train_loop, num_servers=3 if mode == "train-cpus" else 1)
        return
    if mode == "cpus":
        try:
            RayExecutor(num_workers=8, num_servers=2, cpus_per_worker=1, cpus_per_server=1).start()
        except ValueError as exc:
            print(f"REFUSED {exc}", flush=True)
        return
    job_id = f"rayexec{os.getpid()}"
    executor = RayExecutor(num_workers=2, num_servers=1, cpus_per_worker=1, cpus_per_server=1,
                           env={"BYTEPS_JOB_ID": job_id})
    executor.start()
    if mode == "digits":
        print("ACCURACIES " + " ".join(f"{a:.3f}" for a in executor.run(train_digits, args=(10,))), flush=True)
        executor.shutdown()
        return
    victim = executor.workers[1]
    worker_pids = ray.get([worker.pid.remote() for worker in executor.workers])
    from byteps.testkit import processes_with_variable

    carrying = set(processes_with_variable("BYTEPS_JOB_ID", job_id))
    # the job's id is in the environment of the worker actors' processes too, not only in the byteps ones
    print(f"JOB PROCESSES {len(carrying)} WORKERS CARRY THE ID {set(worker_pids) <= carrying}", flush=True)
    killed = []

    def kill_later() -> None:
        time.sleep(3)
        killed.append(time.monotonic())
        ray.kill(victim)

    threading.Thread(target=kill_later, daemon=True).start()
    try:
        executor.run(push_pull_for, args=(60,))
        print("NOT RAISED", flush=True)
    except Exception as exc:  # noqa: BLE001 - what run() raised is the point
        print(f"RAISED {type(exc).__name__} after {time.monotonic() - killed[0]:.1f} s", flush=True)
    print(f"LEFT {left_after(job_id, worker_pids, 15 - (time.monotonic() - killed[0]))}", flush=True)


if __name__ == "__main__":
    main()
