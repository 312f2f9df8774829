"""hvd.join() through real servers: a machine that ran out of data counts as zeros until every machine joined.

Real jobs on 127.0.0.1 (byteps-testkit's run_job), one worker process per
machine, with the current worker's join (byteps.common's ``Worker.join``).
The round policies' own tests (test_round_joined.py) cover what a real job
cannot yet: several processes per machine, and join with backup workers.
"""

import sys

from byteps.testkit import run_job

UNEVEN = r"""
import numpy as np
import byteps.common as bps
from byteps.common.api import worker
bps.init()
rank, size = bps.rank(), bps.size()
batches = lambda r: 2 + r                               # rank r runs out of data after 2 + r steps
for step in range(batches(rank)):
    x = np.full(1500, float((rank + 1) * (step + 1)))   # 12000 bytes: 3 partitions over the servers
    bps.push_pull(x, name="uneven.grad", average=True)
    active = [r for r in range(size) if batches(r) > step]
    expected = sum((r + 1) * (step + 1) for r in active) / size   # joined ranks count as zeros
    assert np.all(x == expected), (step, x[:3], expected)
last, _ = worker().join()
assert last == size - 1, last                           # the rank with the most batches joined last
x = np.full(10, float(rank))
bps.push_pull(x, name="after.join", average=False)      # every machine is back: nobody counts as zeros
assert np.all(x == sum(range(size))), x[:3]
print(f"rank {rank}: JOIN OK", flush=True)
bps.shutdown()
"""


def test_a_joined_machine_counts_as_zeros_until_every_machine_joined():
    result = run_job([sys.executable, "-c", UNEVEN], 3, 2, timeout=90, env={"BYTEPS_PARTITION_BYTES": "4000"})
    assert not result.timed_out, result.failures()
    assert all(code == 0 for code in result.codes.values()), result.failures()
    for rank in range(3):
        assert f"rank {rank}: JOIN OK" in result.outputs[f"worker{rank}"], result.outputs[f"worker{rank}"]
