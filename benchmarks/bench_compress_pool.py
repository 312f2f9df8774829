"""Compression threads: a compressed push_pull with BYTEPS_THREADPOOL_SIZE=0 against N, 1 worker + 1 server.

One float32 tensor (``--mb``, cut into BYTEPS_PARTITION_BYTES partitions)
push_pulled with BytePS's compression_params through a real server on
loopback, the worker's codecs run on its communication thread (0) or on a
pool of ``--threads`` threads, several partitions at once. Each setting is
its own job (the pool size is read at init), the settings alternate
``--jobs`` times, and the figure is the median seconds per push_pull of
each, and the ratio of the medians: the baseline is the same push_pull
without a pool, in the same run.

    python benchmarks/bench_compress_pool.py [--mb 100] [--threads 2] [--repeats 5] [--jobs 3]
        [--compression '{"compressor": "onebit", "scaling": true, "ef": "vanilla"}']
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ONEBIT = {"compressor": "onebit", "scaling": True, "ef": "vanilla"}


def one_job(args: argparse.Namespace) -> None:
    """This process as the worker of one job: print the seconds of each timed push_pull as JSON."""
    sys.path.insert(0, HERE)
    from loopback_job import one_worker_job

    from byteps.common.config import Config

    with one_worker_job(Config.from_env({}).partition_bytes):
        import byteps.common as bps

        bps.init()
        tensor = np.ones(args.mb * (1 << 20) // 4, dtype=np.float32)
        times = []
        for _ in range(args.repeats + 1):  # the first round declares and warms up
            tensor[:] = 1.0
            start = time.perf_counter()
            bps.push_pull(tensor, name="tensor", average=False, compression_params=args.compression, lr=0.1)
            times.append(time.perf_counter() - start)
        assert np.isfinite(tensor).all()
        bps.shutdown()
    print("TIMES " + json.dumps(times[1:]), flush=True)


def run_setting(args: argparse.Namespace, threads: int) -> list:
    env = {**os.environ, "BYTEPS_THREADPOOL_SIZE": str(threads)}
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--as-job", "--mb", str(args.mb),
                          "--repeats", str(args.repeats), "--compression", json.dumps(args.compression)],
                         env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"the job with BYTEPS_THREADPOOL_SIZE={threads} failed:\n{out.stdout}\n{out.stderr}")
    line = next(line for line in out.stdout.splitlines() if line.startswith("TIMES "))
    return json.loads(line[len("TIMES "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="timed push_pulls per job")
    parser.add_argument("--jobs", type=int, default=3, help="jobs per setting, alternating")
    parser.add_argument("--compression", type=json.loads, default=ONEBIT, metavar="JSON")
    parser.add_argument("--as-job", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.as_job:
        one_job(args)
        return
    times = {0: [], args.threads: []}
    for _ in range(args.jobs):
        for threads in times:
            times[threads] += run_setting(args, threads)
    base, pooled = statistics.median(times[0]), statistics.median(times[args.threads])
    print(f"{args.mb} MB, compression_params {json.dumps(args.compression)}, 1 worker + 1 server, loopback\n\n"
          f"| BYTEPS_THREADPOOL_SIZE | s per push_pull (median of {len(times[0])}) |\n|---|---:|\n"
          f"| 0 (the communication thread) | {base:.3f} |\n| {args.threads} | {pooled:.3f} |\n\n"
          f"pool / no pool: {base / pooled:.2f}x faster")


if __name__ == "__main__":
    main()
