"""Local aggregation of CUDA tensors on the GPU against the same through host memory, in one run.

One machine, L worker processes sharing its GPU(s) (local rank modulo the
GPUs), one server on the same machine, a CUDA float32 tensor averaged in
place with push_pull, timed per round until the result is usable
(torch.cuda.synchronize). The two ways of summing inside the machine run as
alternating jobs of the same run:

* gpu:  BYTEPS_GPU_LOCAL_AGGREGATION=1 (the default): device slots shared
  through CUDA IPC, a partition's root sums on the GPU and alone copies it to
  the host and the result back (docs/gpu.md);
* host: BYTEPS_GPU_LOCAL_AGGREGATION=0: every process copies its whole
  tensor to pinned memory and back, the machine sums in shared host memory.

    python benchmarks/gpu/bench_gpu_local_aggregation.py [--local 2] [--mb 100] [--repeats 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time

WORKER_FLAG = "--worker"


def worker(mb: int, repeats: int) -> None:
    import torch

    import byteps.torch as bps
    from byteps.common.api import worker as core

    bps.init()
    torch.cuda.set_device(bps.local_rank() % torch.cuda.device_count())
    tensor = torch.ones(mb * 250_000, dtype=torch.float32, device="cuda")
    times = []
    for _ in range(repeats + 2):  # two warm-ups: the first round maps the peers' slots
        torch.cuda.synchronize()
        start = time.perf_counter()
        bps.push_pull_inplace(tensor, average=True, name="gradient")
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    assert tensor[0].item() == 1.0 and tensor[-1].item() == 1.0, "the average of ones is not one"
    on_gpu = len(core().tasks.staging._shared)
    print(f"TIMES rank {bps.rank()} on_gpu={on_gpu} " + " ".join(f"{t:.6f}" for t in times[2:]), flush=True)
    bps.shutdown()


def one_job(local: int, mb: int, repeats: int, gpu_local: bool) -> list:
    from byteps.testkit import run_job

    env = {"BYTEPS_GPU_LOCAL_AGGREGATION": "1" if gpu_local else "0", "BYTEPS_FORCE_DISTRIBUTED": "1"}
    result = run_job([sys.executable, os.path.abspath(__file__), WORKER_FLAG, str(mb), str(repeats)], 1, 1,
                     local_size=local, env=env, timeout=300)
    if result.timed_out or any(result.codes.values()):
        sys.exit("bench_gpu_local_aggregation: the job failed:\n" + result.failures())
    rounds = []  # per round, the slowest rank's time (the round is done when every rank is)
    for rank in range(local):
        found = re.search(r"TIMES rank \d+ on_gpu=(\d+) (.*)", result.outputs[f"worker{rank}"])
        assert (int(found.group(1)) > 0) == gpu_local, found.group(0)
        times = [float(t) for t in found.group(2).split()]
        rounds = [max(a, b) for a, b in zip(rounds, times)] if rounds else times
    return rounds


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == WORKER_FLAG:
        worker(int(sys.argv[2]), int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local", type=int, default=2, help="worker processes on the machine")
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--pairs", type=int, default=2, help="gpu/host job pairs, alternating")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    runs = {"gpu": [], "host": []}
    for _ in range(args.pairs):
        for mode in ("gpu", "host"):
            runs[mode].extend(one_job(args.local, args.mb, args.repeats, mode == "gpu"))
    medians = {mode: statistics.median(times) for mode, times in runs.items()}
    figures = {"local": args.local, "tensor_mb": args.mb, "seconds_median": medians, "seconds_all": runs,
               "host_over_gpu": medians["host"] / medians["gpu"]}
    print(f"| {args.local} processes, {args.mb} MB float32 | median s per round |\n|---|---|")
    print(f"| local sums on the GPU (BYTEPS_GPU_LOCAL_AGGREGATION=1) | {medians['gpu']:.4f} |")
    print(f"| local sums in host memory (=0) | {medians['host']:.4f} |")
    print(f"| host / gpu | {figures['host_over_gpu']:.2f} |")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=2)


if __name__ == "__main__":
    main()
