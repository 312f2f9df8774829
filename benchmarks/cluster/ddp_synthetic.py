"""The end-to-end baseline: examples/torch/synthetic_benchmark.py's model trained with native DDP over gloo.

Same model, data, batch, optimizer and output lines ("Total img/sec on N
worker(s): ...") as the byteps script, so the rig parses both alike; only
the gradient exchange differs: torch.nn.parallel.DistributedDataParallel
(ring all_reduce over gloo, 25 MB buckets, overlapped with backward)
instead of byteps' DistributedOptimizer. Rank and world size come from the
DMLC variables the rig sets; rank 0's host is the rendezvous (--master).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import timeit

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from timing import role_env

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "torch",
                       "synthetic_benchmark.py")


def load_models():
    """MODELS and build_model of the byteps synthetic benchmark (one definition of the models)."""
    spec = importlib.util.spec_from_file_location("synthetic_benchmark", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MODELS, module.build_model


def main() -> None:
    models, build_model = load_models()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet20", choices=list(models))
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--num-warmup-batches", type=int, default=10)
    parser.add_argument("--num-batches-per-iter", type=int, default=10)
    parser.add_argument("--num-iters", type=int, default=10)
    parser.add_argument("--num-threads", type=int, default=1)
    parser.add_argument("--master", required=True, help="address:port of rank 0's rendezvous")
    args = parser.parse_args()
    role = role_env()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", os.environ.get("DMLC_INTERFACE", "eth0"))
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=role["rank"], world_size=role["size"])
    size = dist.get_world_size()
    torch.set_num_threads(args.num_threads)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(build_model(args.model, args.image_size))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * size, momentum=0.9)
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.randint(0, 10, (args.batch_size,))

    def benchmark_step() -> None:
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    def log(text: str) -> None:
        if role["rank"] == 0:
            print(text, flush=True)

    log(f"Model: {args.model}, DDP over gloo, {size} worker(s), {args.num_threads} thread(s) each")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    img_secs = []
    for i in range(args.num_iters):
        elapsed = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_secs.append(args.batch_size * args.num_batches_per_iter / elapsed)
        log(f"Iter #{i}: {img_secs[-1]:.1f} img/sec per worker")
    mean, conf = np.mean(img_secs), 1.96 * np.std(img_secs)
    log(f"Img/sec per worker: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {size} worker(s): {size * mean:.1f} +-{size * conf:.1f}")
    dist.destroy_process_group()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
