"""Data-parallel training of a small CNN on scikit-learn's digits with byteps.torch.

The data (1,797 8x8 images of handwritten digits) ships inside scikit-learn,
so nothing is downloaded. Each worker trains on its own shard of the
training set (DistributedSampler); DistributedOptimizer averages the
gradients over all workers every step, so all workers keep identical
weights. Run it with the launcher:

    bpslaunch --workers 2 --servers 1 -- python examples/torch/train_digits.py

``--checkpoint-dir DIR`` saves the model and optimizer after every epoch
and resumes from the last one on start, e.g. after bpslaunch restarted a
failed job (``bpslaunch --max-restarts 2 ...``).

``--device cuda`` trains on the GPU (local rank ``i`` takes GPU ``i`` modulo
the GPUs it sees, so several workers may share one); gradients stay CUDA
tensors and byteps stages them through pinned host memory (docs/gpu.md).

Rank 0 prints the progress (a bar per epoch when tqdm is installed, then one
line per epoch) and the held-out accuracy; the script exits
non-zero if that accuracy is below --min-accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import byteps.torch as bps

try:  # a progress bar per epoch on rank 0 when tqdm is there (`nox -s demo` installs it)
    from tqdm import tqdm
except ImportError:
    tqdm = None


class DigitsNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = torch.nn.Linear(32 * 4 * 4, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def load_data(seed: int) -> tuple:
    digits = load_digits()
    images = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)   # N x 1 x 8 x 8 in [0, 1]
    labels = torch.tensor(digits.target, dtype=torch.long)
    train_idx, test_idx = train_test_split(range(len(labels)), test_size=0.2, random_state=seed,
                                           stratify=digits.target)
    return (TensorDataset(images[train_idx], labels[train_idx]),
            TensorDataset(images[test_idx], labels[test_idx]))


def evaluate(model: torch.nn.Module, dataset: TensorDataset, device: torch.device) -> float:
    model.eval()
    with torch.no_grad():
        images, labels = (t.to(device) for t in dataset.tensors)
        accuracy = (model(images).argmax(dim=1) == labels).float().mean().item()
    model.train()
    return accuracy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.05,
                        help="per worker; scaled by the number of workers when they average gradients (not in "
                             "asynchronous training, BYTEPS_ENABLE_ASYNC=1, where every worker's step lands)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fp16-pushpull", action="store_true", help="send gradients as float16")
    parser.add_argument("--compression", type=json.loads, default=None, metavar="JSON",
                        help="BytePS's compression_params, e.g. "
                             "'{\"compressor\": \"onebit\", \"scaling\": true, \"ef\": \"vanilla\"}'")
    parser.add_argument("--min-accuracy", type=float, default=0.9)
    parser.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                        help="save after every epoch (rank 0, atomically) and resume from the last save on start")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: local rank i trains on GPU i modulo the GPUs this process sees")
    args = parser.parse_args()

    bps.init()
    device = torch.device("cpu")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
            return 2
        device = torch.device("cuda", bps.local_rank() % torch.cuda.device_count())
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed + bps.rank())   # different initial weights: the broadcast must fix that
    torch.set_num_threads(1)   # a model this small only loses time to more threads
    train_set, test_set = load_data(args.seed)
    sampler = DistributedSampler(train_set, num_replicas=bps.size(), rank=bps.rank(), shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)

    model = DigitsNet().to(device)
    # Averaged gradients take n workers' worth of data per step: scale the rate (Horovod's rule). In
    # asynchronous training every worker's own step is added to the servers' parameters: keep it.
    scale = 1 if os.environ.get("BYTEPS_ENABLE_ASYNC", "0") == "1" else bps.size()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * scale, momentum=0.9)
    optimizer = bps.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(),
        compression=bps.Compression.fp16 if args.fp16_pushpull else bps.Compression.none,
        compression_params=args.compression)
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bps.broadcast_optimizer_state(optimizer, root_rank=0)
    first_epoch = 1
    if args.checkpoint_dir:
        resumed = bps.load_checkpoint(args.checkpoint_dir, model, optimizer)
        if resumed is not None:
            first_epoch = resumed["step"] + 1
            if bps.rank() == 0:
                print(f"resumed after epoch {resumed['step']} from {args.checkpoint_dir} "
                      f"(restart {os.environ.get('BYTEPS_RESTART_COUNT', '0')})", flush=True)

    if bps.rank() == 0:
        print(f"training on {len(train_set)} images with {bps.size()} worker(s) on {device}, "
              f"{len(sampler)} images and {len(loader)} steps per worker per epoch", flush=True)
    for epoch in range(first_epoch, args.epochs + 1):
        sampler.set_epoch(epoch)
        started, loss_sum, correct, seen = time.perf_counter(), 0.0, 0, 0
        batches = loader
        if bps.rank() == 0 and tqdm is not None:
            batches = tqdm(loader, desc=f"epoch {epoch:2d}", leave=False, file=sys.stdout, ncols=72, mininterval=0.2)
        for images, labels in batches:
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            optimizer.zero_grad()
            logits = model(images)
            loss = F.cross_entropy(logits, labels)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(labels)
            correct += (logits.argmax(dim=1) == labels).sum().item()
            seen += len(labels)
        elapsed = time.perf_counter() - started
        if bps.rank() == 0:
            print(f"epoch {epoch:2d}: loss {loss_sum / seen:.4f}  train accuracy {correct / seen:.3f}  "
                  f"{seen * bps.size() / elapsed:.0f} samples/s (all workers)", flush=True)
        if args.checkpoint_dir:
            bps.save_checkpoint(args.checkpoint_dir, model, optimizer, step=epoch)

    accuracy = evaluate(model, test_set, device)
    if bps.rank() == 0:
        print(f"held-out accuracy {accuracy:.3f} on {len(test_set)} images", flush=True)
    bps.shutdown()
    if accuracy < args.min_accuracy:
        print(f"accuracy {accuracy:.3f} is below --min-accuracy {args.min_accuracy}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
