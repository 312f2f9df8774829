"""hvd.join() in every layout of the framework-neutral core: real jobs (scheduler, servers, workers on 127.0.0.1).

Two machines of two processes each with two servers is BytePS's usual
layout: a joined local root stands in for its peer, and a machine whose
processes all joined is counted as zeros by the servers. With backup
workers too, a joined machine no longer holds the others back.
"""

from __future__ import annotations

import os
import sys

import pytest

from byteps.testkit import run_job

WORKER = [sys.executable, os.path.join(os.path.dirname(__file__), "join_worker.py")]


@pytest.mark.parametrize("workers,servers,local_size,backup", [
    (2, 2, 2, 0),  # two machines of two processes, servers
    (1, 0, 3, 0),  # one machine of three processes, no servers
    (3, 1, 1, 0),  # three machines of one process
    (2, 2, 2, 1),  # two machines of two processes, backup workers (rounds close at one machine)
])
def test_uneven_data_joins_in_every_layout(workers, servers, local_size, backup):
    env = {"BYTEPS_BACKUP_WORKERS": str(backup)} if backup else {}
    result = run_job(WORKER, workers, servers, local_size=local_size, env=env, timeout=90)
    assert not result.timed_out, "job timed out:\n" + result.failures()
    assert all(code == 0 for code in result.codes.values()), result.failures()
    size = workers * local_size
    for rank in range(size):
        assert f"JOIN OK rank {rank} of {size}" in result.outputs[f"worker{rank}"], result.failures()
