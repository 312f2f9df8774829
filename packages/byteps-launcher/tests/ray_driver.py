"""Driver of the Ray tests, run inside the test's network namespace against the Ray cluster started there.

Usage: python ray_driver.py ADDRESS digits|kill|cpus|train|train-fails|train-cpus
digits: 2 worker actors and 1 server actor train the digits model; prints each worker's accuracy.
kill:   the workers push_pull for up to 60 s; worker 1's actor is killed after 3 s; prints how long run()
        took to raise, and what.
cpus:   asks for more CPUs than the cluster has; prints the error.
train:  the same training through Ray Train (BytePSTrainer, 2 workers, 1 server); prints rank 0's accuracy.
train-fails: a Ray Train run whose rank 1 raises; prints the error fit() raised.
train-cpus: a Ray Train run whose servers ask for more CPUs than its workers left free; prints the error.
"""

from __future__ import annotations

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
    if bps.rank() == 1:
        raise RuntimeError("rank 1 gives up")
    push_pull_for(30)


def fit(loop, num_servers: int = 1) -> None:
    from ray.train import RunConfig, ScalingConfig

    from byteps.launcher.ray_train import BytePSConfig, BytePSTrainer

    trainer = BytePSTrainer(loop, train_loop_config={"epochs": 10},
                            scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
                            byteps_config=BytePSConfig(num_servers=num_servers, cpus_per_server=1),
                            run_config=RunConfig(storage_path="/tmp/byteps-ray-train"))
    started = time.monotonic()
    try:
        result = trainer.fit()
        print(f"ACCURACY {result.return_value:.3f}", flush=True)
    except Exception as exc:  # noqa: BLE001 - what fit() raised is the point
        print(f"FIT RAISED {type(exc).__name__} after {time.monotonic() - started:.1f} s", flush=True)
        print(f"ERROR TEXT {str(exc)[:1000]!r}", flush=True)
        print(f"SERVERS LEFT {servers_left_after(15)}", flush=True)


def servers_left_after(seconds: float) -> int:
    """How many byteps scheduler/server processes still run after up to ``seconds`` (they must all stop)."""
    import subprocess

    deadline = time.monotonic() + seconds
    while True:
        found = subprocess.run(["pgrep", "-f", "-m byteps.server"], capture_output=True, text=True).stdout.split()
        if not found or time.monotonic() > deadline:
            return len(found)
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
    executor = RayExecutor(num_workers=2, num_servers=1, cpus_per_worker=1, cpus_per_server=1)
    executor.start()
    if mode == "digits":
        print("ACCURACIES " + " ".join(f"{a:.3f}" for a in executor.run(train_digits, args=(10,))), flush=True)
        executor.shutdown()
        return
    victim = executor.workers[1]
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
    assert executor.workers == [] and executor.services == []


if __name__ == "__main__":
    main()
