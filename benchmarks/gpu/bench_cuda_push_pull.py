"""push_pull of a CUDA tensor, 1 worker + 1 local server, against the copy bound of the same bytes.

Measured in one run on one GPU machine:

* bound: one device-to-host copy of the tensor into pinned memory plus one
  host-to-device copy back (torch, non_blocking, timed to completion). The
  staging of a CUDA push_pull cannot be cheaper than that;
* host push_pull: the same bytes as a CPU tensor, the same job (what the
  network part costs on its own);
* cuda push_pull: the CUDA tensor through byteps (staged partition by
  partition, docs/gpu.md), timed until the result is usable on the caller's
  stream (torch.cuda.synchronize);
* NCCL all_reduce through torch.distributed on the same GPU count, for
  orientation (one GPU: NCCL moves nothing across a wire).

    python benchmarks/gpu/bench_cuda_push_pull.py [--mb 100] [--repeats 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from byteps.common.config import Config

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from loopback_job import free_port, one_worker_job  # noqa: E402  (benchmarks/loopback_job.py)

PARTITION_BYTES = Config.from_env({}).partition_bytes  # the default, as users run it


def note(what: str) -> None:
    """A timestamped progress line on stderr (where the time goes between the timed parts)."""
    print(f"bench {time.strftime('%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d} {what}", file=sys.stderr,
          flush=True)


def timed(action, repeats: int) -> list:
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        torch.cuda.synchronize()
        start = time.perf_counter()
        action()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times[1:]


def copy_bound(tensor: torch.Tensor, repeats: int) -> list:
    pinned = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)

    def both_ways() -> None:
        pinned.copy_(tensor, non_blocking=True)
        tensor.copy_(pinned, non_blocking=True)

    return timed(both_ways, repeats)


def byteps_times(nbytes: int, repeats: int) -> dict:
    with one_worker_job(PARTITION_BYTES):
        import byteps.torch as bps
        from byteps.common import api

        note("init")
        bps.init()
        device_tensor = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
        host_tensor = torch.ones(nbytes // 4, dtype=torch.float32)
        note("copy bound")
        figures = {"bound": copy_bound(device_tensor, repeats)}
        note("host push_pull")
        figures["host"] = timed(lambda: bps.push_pull_inplace(host_tensor, average=False, name="host"), repeats)
        note("cuda push_pull")
        figures["cuda"] = timed(lambda: bps.push_pull_inplace(device_tensor, average=False, name="cuda"), repeats)
        assert device_tensor[0].item() == 1.0 and host_tensor[0].item() == 1.0  # one worker: the sum is the input
        bps.shutdown()
        api.shutdown()  # leave the job now (byteps.torch's shutdown keeps the process in it for a re-init)
        note("shut down")
    return figures


NCCL = r"""
import sys, time, torch, torch.distributed as dist
dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=0, world_size=1)
x = torch.ones(int(sys.argv[2]) // 4, device="cuda")
times = []
for _ in range(int(sys.argv[3]) + 1):
    torch.cuda.synchronize(); start = time.perf_counter()
    dist.all_reduce(x); torch.cuda.synchronize()
    times.append(time.perf_counter() - start)
print(" ".join(str(t) for t in times[1:]))
dist.destroy_process_group()
"""


def nccl_times(nbytes: int, repeats: int) -> list:
    done = subprocess.run([sys.executable, "-c", NCCL, str(free_port()), str(nbytes), str(repeats)],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        print(f"NCCL all_reduce failed: {done.stderr[-500:]}", file=sys.stderr)
        return []
    return [float(t) for t in done.stdout.split()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_cuda_push_pull: torch sees no CUDA device")
    nbytes = args.mb * 1000 * 1000
    runs = byteps_times(nbytes, args.repeats)
    runs["nccl"] = nccl_times(nbytes, args.repeats)
    medians = {k: statistics.median(v) for k, v in runs.items() if v}
    figures = {"tensor_mb": args.mb, "partition_bytes": PARTITION_BYTES, "gpu": torch.cuda.get_device_name(),
               "seconds_median": medians, "seconds_all": runs,
               "cuda_over_bound": medians["cuda"] / medians["bound"],
               "cuda_over_host": medians["cuda"] / medians["host"]}
    bound = medians["bound"]
    rows = [("device-to-host + host-to-device copy of the same bytes (pinned)", "bound"),
            ("byteps push_pull, CPU tensor", "host"), ("byteps push_pull, CUDA tensor", "cuda"),
            ("NCCL all_reduce (torch.distributed, 1 GPU)", "nccl")]
    print(f"| {args.mb} MB float32 on {figures['gpu']} | median s | x bound |\n|---|---|---|")
    for label, key in rows:
        if key in medians:
            print(f"| {label} | {medians[key]:.4f} | {medians[key] / bound:.2f} |")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=2)


if __name__ == "__main__":
    main()
