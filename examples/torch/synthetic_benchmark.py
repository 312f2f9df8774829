"""Synthetic data-parallel benchmark in the style of Horovod's pytorch_synthetic_benchmark.py.

Trains a small CIFAR-style ResNet (defined here, no torchvision), or with
``--model mlp`` a wide MLP whose steps are bound by communication, on random
32x32 images and reports images per second per worker and in total, as
mean +- 1.96 standard deviations over the timed iterations. Without the
launcher it measures one worker (no communication); with it, e.g.

    bpslaunch -np 2 -- python examples/torch/synthetic_benchmark.py
    bpslaunch --workers 2 --servers 2 -- python examples/torch/synthetic_benchmark.py

each worker push_pulls its gradients through byteps every step
(``--compression-params JSON``: compressed as BytePS does).
"""

from __future__ import annotations

import argparse
import json
import os
import timeit

import numpy as np
import torch
import torch.nn.functional as F

import byteps.torch as bps


class BasicBlock(torch.nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(planes)
        self.conv2 = torch.nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(planes)
        self.shortcut = torch.nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = torch.nn.Sequential(torch.nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                                                torch.nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(torch.nn.Module):
    """The CIFAR ResNet of He et al. (6n+2 layers, 16/32/64 channels) for 32x32 inputs."""

    def __init__(self, depth: int, num_classes: int = 10) -> None:
        super().__init__()
        if (depth - 2) % 6:
            raise ValueError(f"a CIFAR ResNet has 6n+2 layers, not {depth}")
        n = (depth - 2) // 6
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(16)
        layers, in_planes = [], 16
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(n):
                layers.append(BasicBlock(in_planes, planes, stride if i == 0 else 1))
                in_planes = planes
        self.layers = torch.nn.Sequential(*layers)
        self.fc = torch.nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(F.relu(self.bn(self.conv(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class WideMLP(torch.nn.Module):
    """A communication-bound model: 10.5 M parameters (42 MB of gradients) and little compute per image."""

    def __init__(self, image_size: int = 32, width: int = 2048, num_classes: int = 10) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * image_size * image_size, width),
                                          torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
                                          torch.nn.Linear(width, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


#: name -> the model's builder (given the image size); resnets by depth, then the wide MLP.
MODELS = {**{f"resnet{depth}": (lambda image_size, depth=depth: ResNet(depth)) for depth in (8, 14, 20, 32, 44, 56)},
          "mlp": WideMLP}


def build_model(name: str, image_size: int = 32) -> torch.nn.Module:
    """The benchmark's model ``name`` (a key of MODELS) for square images of ``image_size``."""
    return MODELS[name](image_size)


def default_num_threads() -> int:
    """This process's share of the machine's cores.

    Workers of an embedded job (scheduler on a loopback address) all run
    on this machine; otherwise the local processes share it.
    """
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    on_this_machine = bps.size() if os.environ.get("DMLC_PS_ROOT_URI", "").startswith("127.") else bps.local_size()
    return max(1, cpus // on_this_machine)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet20", choices=list(MODELS),
                        help="a CIFAR ResNet, or mlp: communication-bound (10.5 M parameters, little compute)")
    parser.add_argument("--batch-size", type=int, default=16, help="input batch size per worker")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--num-warmup-batches", type=int, default=10, help="batches before timing starts")
    parser.add_argument("--num-batches-per-iter", type=int, default=10, help="batches per timed iteration")
    parser.add_argument("--num-iters", type=int, default=10, help="timed iterations")
    parser.add_argument("--num-threads", type=int, default=0, help="torch threads (default: this worker's cores)")
    parser.add_argument("--fp16-pushpull", action="store_true", help="push_pull gradients as float16")
    parser.add_argument("--compression-params", type=json.loads, default=None, metavar="JSON",
                        help='BytePS\'s gradient compression, e.g. \'{"compressor": "onebit", "scaling": true, '
                             '"ef": "vanilla"}\' (docs/compression.md)')
    args = parser.parse_args()

    bps.init()
    torch.set_num_threads(args.num_threads or default_num_threads())
    torch.manual_seed(0)
    model = build_model(args.model, args.image_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * bps.size(), momentum=0.9)
    compression = bps.Compression.fp16 if args.fp16_pushpull else bps.Compression.none
    optimizer = bps.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, compression_params=args.compression_params)
    bps.broadcast_parameters(model.state_dict(), root_rank=0)
    bps.broadcast_optimizer_state(optimizer, root_rank=0)

    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.randint(0, 10, (args.batch_size,))

    def benchmark_step() -> None:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()

    def log(text: str) -> None:
        if bps.rank() == 0:
            print(text, flush=True)

    parameters = sum(p.numel() for p in model.parameters())
    log(f"Model: {args.model} ({parameters / 1e6:.2f} M parameters)")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of workers: {bps.size()} (CPU, {torch.get_num_threads()} thread(s) each)")
    log(f"Gradient compression: {'fp16' if args.fp16_pushpull else 'none'}"
        + (f", compression_params {json.dumps(args.compression_params)}" if args.compression_params else ""))

    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)

    log("Running benchmark...")
    img_secs = []
    for i in range(args.num_iters):
        elapsed = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / elapsed
        log(f"Iter #{i}: {img_sec:.1f} img/sec per worker")
        img_secs.append(img_sec)

    img_sec_mean = np.mean(img_secs)
    img_sec_conf = 1.96 * np.std(img_secs)
    log(f"Img/sec per worker: {img_sec_mean:.1f} +-{img_sec_conf:.1f}")
    log(f"Total img/sec on {bps.size()} worker(s): {bps.size() * img_sec_mean:.1f} +-{bps.size() * img_sec_conf:.1f}")
    bps.shutdown()


if __name__ == "__main__":
    main()
