"""Tensor fusion: 500 tensors of 4 KB per round, fused vs unfused, 2 workers + 1 server on loopback.

Each round push_pulls (averages) the same 500 float32 tensors of 4 KB on
both workers and waits for all of them: unfused, each tensor alone (each
pays the per-message cost: a task, a PUSH, a PULL, a round trip, a handle);
fused, one grouped call, which packs them into buckets of
BYTEPS_FUSION_THRESHOLD bytes (default 4096000: one 2 MB bucket). Both modes
run in the same job, alternating repeat by repeat, so the machine's noise
hits both alike. Reported: rounds per second of each (median over repeats)
and the median of the per-repeat ratios.

``--framework`` picks whose API a round goes through (the package must be
installed):

* ``common``: byteps.common's push_pull_async per tensor vs push_pull_group_async;
* ``torch``: byteps.torch's push_pull_async_inplace per tensor vs push_pull_group_async;
* ``tf``: byteps.tensorflow's ``GradientReducer.reduce`` over every tensor
  (eager), with fusion off (fusion_threshold 0 for that call) vs on: the
  reducer DistributedGradientTape and DistributedOptimizer call, not the
  wrappers themselves;
* ``mxnet``: byteps.mxnet's allreduce_ per array vs ``allreduce_group_``,
  the op DistributedTrainer calls for its small gradients (the trainer itself
  is not timed).

No row times a whole optimizer or trainer step: each times the call named.

``--compression JSON`` (common only): BytePS's compression_params on every
tensor; fused, the compressed tensors share buckets of one partition, each
compressed alone (docs/compression.md).

    python benchmarks/bench_fusion.py [--framework common] [--tensors 500] [--kb 4] [--rounds 20] [--repeats 7]
    BYTEPS_MIN_COMPRESS_BYTES=0 python benchmarks/bench_fusion.py --tensors 200 --kb 64 \
        --compression '{"compressor": "onebit", "scaling": true, "ef": "vanilla"}'
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import numpy as np


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def common_rounds(args: argparse.Namespace, count: int, names: dict) -> tuple:
    import byteps.common as bps

    bps.init()
    tensors = {mode: [np.ones(count, dtype=np.float32) for _ in range(args.tensors)] for mode in names}

    params = args.compression

    def unfused_round() -> None:
        handles = [bps.push_pull_async(t, name=n, compression_params=params)
                   for t, n in zip(tensors["unfused"], names["unfused"])]
        for handle in handles:
            bps.synchronize(handle)

    def fused_round() -> None:
        for handle in bps.push_pull_group_async(tensors["fused"], names["fused"], compression_params=params):
            bps.synchronize(handle)

    exact = not params or (params.get("compressor") == "onebit" and params.get("scaling"))

    def check() -> bool:  # ones everywhere average to ones, through onebit with scaling too; other codecs drop some
        if not exact:
            return all(np.isfinite(t).all() for ts in tensors.values() for t in ts)
        return all(t[0] == 1.0 and t[-1] == 1.0 for ts in tensors.values() for t in ts)

    return bps, unfused_round, fused_round, check


def torch_rounds(args: argparse.Namespace, count: int, names: dict) -> tuple:
    import torch

    import byteps.torch as bps

    bps.init()
    tensors = {mode: [torch.ones(count) for _ in range(args.tensors)] for mode in names}

    def unfused_round() -> None:
        handles = [bps.push_pull_async_inplace(t, name=n) for t, n in zip(tensors["unfused"], names["unfused"])]
        for handle in handles:
            bps.synchronize(handle)

    def fused_round() -> None:
        for handle in bps.push_pull_group_async(tensors["fused"], names=names["fused"]):
            bps.synchronize(handle)

    def check() -> bool:
        return all(bool((t == 1.0).all()) for ts in tensors.values() for t in ts)

    return bps, unfused_round, fused_round, check


def tf_rounds(args: argparse.Namespace, count: int, names: dict) -> tuple:
    import dataclasses

    import tensorflow as tf

    import byteps.tensorflow as bps
    from byteps.common import api
    from byteps.tensorflow.gradients import GradientReducer

    bps.init()
    tensors = [tf.ones([count]) for _ in range(args.tensors)]
    reducers = {mode: GradientReducer(f"bench.{mode}") for mode in names}
    worker = api.worker()
    fusion_on = worker.config
    fusion_off = dataclasses.replace(fusion_on, fusion_threshold=0)
    results = {}

    def unfused_round() -> None:
        worker.config = fusion_off   # benchmark only: the same reducer with fusion off for this call
        try:
            results["unfused"] = reducers["unfused"].reduce(tensors)
        finally:
            worker.config = fusion_on

    def fused_round() -> None:
        results["fused"] = reducers["fused"].reduce(tensors)

    def check() -> bool:
        return all(float(tf.reduce_min(t)) == 1.0 == float(tf.reduce_max(t)) for ts in results.values() for t in ts)

    return bps, unfused_round, fused_round, check


def mxnet_rounds(args: argparse.Namespace, count: int, names: dict) -> tuple:
    import mxnet as mx

    import byteps.mxnet as bps
    from byteps.mxnet.ops import allreduce_group_

    bps.init()
    tensors = {mode: [mx.nd.ones((count,)) for _ in range(args.tensors)] for mode in names}

    def unfused_round() -> None:
        for t, n in zip(tensors["unfused"], names["unfused"]):
            bps.allreduce_(t, name=n)
        mx.nd.waitall()

    def fused_round() -> None:
        allreduce_group_(tensors["fused"], names["fused"])
        mx.nd.waitall()

    def check() -> bool:
        return all(float(t.min().asscalar()) == 1.0 == float(t.max().asscalar()) for ts in tensors.values() for t in ts)

    return bps, unfused_round, fused_round, check


FRAMEWORKS = {"common": common_rounds, "torch": torch_rounds, "tf": tf_rounds, "mxnet": mxnet_rounds}
#: what each mode of a framework times, as its table rows name it: (unfused, fused)
CALLS = {"common": ("push_pull_async per tensor", "push_pull_group_async"),
         "torch": ("push_pull_async_inplace per tensor", "push_pull_group_async"),
         "tf": ("GradientReducer.reduce, fusion off", "GradientReducer.reduce, fusion on"),
         "mxnet": ("allreduce_ per array", "allreduce_group_")}


def worker_main(args: argparse.Namespace) -> None:
    """One worker process: time both modes, print rank 0's figures as JSON."""
    count = args.kb * 1024 // 4
    names = {mode: [f"{mode}.{i}" for i in range(args.tensors)] for mode in ("unfused", "fused")}
    bps, unfused_round, fused_round, check = FRAMEWORKS[args.framework](args, count, names)

    def rounds_per_second(one_round) -> float:
        start = time.perf_counter()
        for _ in range(args.rounds):
            one_round()
        return args.rounds / (time.perf_counter() - start)

    for one_round in (unfused_round, fused_round):  # warm up: declare, allocate, connect
        one_round()
    figures = {"unfused": [], "fused": []}
    for _ in range(args.repeats):
        figures["unfused"].append(rounds_per_second(unfused_round))
        figures["fused"].append(rounds_per_second(fused_round))
    # every input was ones on both workers: the averages must be ones
    assert check(), "wrong average"
    if bps.rank() == 0:
        print("FIGURES " + json.dumps(figures), flush=True)
    bps.shutdown()


def run_job(args: argparse.Namespace) -> dict:
    port = free_port()
    env = {**os.environ, "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
           "DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "1", "DMLC_INTERFACE": "lo", "PYTHONUNBUFFERED": "1"}
    server = [sys.executable, "-m", "byteps.server"]
    worker = [sys.executable, os.path.abspath(__file__), "--as-worker", "--framework", args.framework,
              "--tensors", str(args.tensors),
              "--kb", str(args.kb), "--rounds", str(args.rounds), "--repeats", str(args.repeats),
              *(["--compression", json.dumps(args.compression)] if args.compression else [])]
    procs = [subprocess.Popen(server, env={**env, "DMLC_ROLE": role}) for role in ("scheduler", "server")]
    workers = [subprocess.Popen(worker, env={**env, "DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(w)},
                                stdout=subprocess.PIPE, text=True) for w in range(2)]
    try:
        outputs = [w.communicate(timeout=600)[0] for w in workers]
        if any(w.returncode != 0 for w in workers):
            raise SystemExit(f"a worker failed: exit codes {[w.returncode for w in workers]}\n" + "\n".join(outputs))
        for proc in procs:
            proc.wait(timeout=30)
    finally:
        for proc in procs + workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    line = next(line for line in outputs[0].splitlines() if line.startswith("FIGURES "))
    return json.loads(line[len("FIGURES "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=sorted(FRAMEWORKS), default="common",
                        help="whose API a round goes through (default: byteps.common)")
    parser.add_argument("--tensors", type=int, default=500)
    parser.add_argument("--kb", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=20, help="rounds per timed repeat, each mode")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--compression", type=json.loads, default=None, metavar="JSON",
                        help="BytePS's compression_params on every tensor (framework common)")
    parser.add_argument("--as-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.compression and args.framework != "common":
        parser.error("--compression goes with --framework common")
    if args.as_worker:
        worker_main(args)
        return
    raw = run_job(args)
    ratios = [f / u for f, u in zip(raw["fused"], raw["unfused"])]
    figures = {
        "framework": args.framework, "tensors": args.tensors, "tensor_kb": args.kb, "rounds": args.rounds,
        "repeats": args.repeats, "compression": args.compression,
        "fusion_threshold": int(os.environ.get("BYTEPS_FUSION_THRESHOLD", 4096000)),
        "unfused_rounds_per_s": statistics.median(raw["unfused"]),
        "fused_rounds_per_s": statistics.median(raw["fused"]),
        "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
        "raw": raw,
    }
    compressed = f", compression_params {json.dumps(args.compression)}" if args.compression else ""
    print(f"{args.framework}: {args.tensors} tensors of {args.kb} KB{compressed}\n\n"
          f"| mode | rounds/s (median of {args.repeats}) | tensors/s |\n|---|---:|---:|\n"
          f"| unfused: {CALLS[args.framework][0]} | {figures['unfused_rounds_per_s']:.1f} | "
          f"{figures['unfused_rounds_per_s'] * args.tensors:.0f} |\n"
          f"| fused: {CALLS[args.framework][1]} | {figures['fused_rounds_per_s']:.1f} | "
          f"{figures['fused_rounds_per_s'] * args.tensors:.0f} |\n\n"
          f"fused / unfused: median {figures['ratio_median']:.1f}x "
          f"(per repeat {figures['ratio_min']:.1f}x–{figures['ratio_max']:.1f}x)")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=2)


if __name__ == "__main__":
    main()
