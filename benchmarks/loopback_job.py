"""This benchmark process as the one worker of a job with a scheduler and a server on loopback.

    with one_worker_job(partition_bytes):
        import byteps.common as bps      # or an adapter
        bps.init()
        ...
        bps.shutdown()                   # the job's end: the scheduler and server exit

Used by bench_push_pull.py and gpu/bench_cuda_push_pull.py (not a benchmark itself).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from typing import Iterator


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def one_worker_job(partition_bytes: int) -> Iterator[None]:
    """Start a scheduler and a server, make this process's environment the worker's; on leaving, wait
    for both (20 s each) and kill what is left."""
    env = {**os.environ, "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(free_port()),
           "DMLC_NUM_WORKER": "1", "DMLC_NUM_SERVER": "1", "DMLC_INTERFACE": "lo",
           "BYTEPS_FORCE_DISTRIBUTED": "1", "BYTEPS_PARTITION_BYTES": str(partition_bytes)}
    procs = [subprocess.Popen([sys.executable, "-m", "byteps.server"], env={**env, "DMLC_ROLE": role})
             for role in ("scheduler", "server")]
    os.environ.update({**env, "DMLC_ROLE": "worker"})
    try:
        yield
    finally:
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
