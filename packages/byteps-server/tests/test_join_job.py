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


SPARSE_UNEVEN = r"""
import numpy as np
import byteps.common as bps
from byteps.common.api import worker
bps.init()
rank, size = bps.rank(), bps.size()
batches = lambda r: 2 + r                               # rank r runs out of data after 2 + r steps

def pushed(table, r, step):                             # rank r's (ids, rows) of a table in a step, duplicates too
    ids = np.array([step, 10 + r, step, 40 + 7 * r + step]) % (50 if table == "tail" else 100)
    rows = np.arange(len(ids) * 4, dtype=np.float32).reshape(len(ids), 4) + 10 * r + step
    return ids, rows

def expected(table, ranks, step):                       # numpy: rows summed by id over ``ranks``, / size
    total = {}
    for r in ranks:
        for i, row in zip(*pushed(table, r, step)):
            total[int(i)] = total.get(int(i), 0) + row
    ids = np.array(sorted(total), dtype=np.int64)
    return ids, np.array([total[i] for i in ids], dtype=np.float32).reshape(-1, 4) / size

def check(table, ranks, step):
    rows = 50 if table == "tail" else 100
    ids, sums = bps.sparse_push_pull(*pushed(table, rank, step), table, rows, (4,), average=True)
    want_ids, want = expected(table, ranks, step)
    assert np.array_equal(ids, want_ids) and np.allclose(sums, want), (table, step, ids, want_ids)

for step in range(batches(rank)):
    check("emb", [r for r in range(size) if batches(r) > step], step)   # joined ranks push no rows
    if step >= 3:                                       # the last rank alone: a table the others never used
        check("tail", [rank], step)
last, _ = worker().join()
assert last == size - 1, last
for table in ("emb", "tail", "late"):                   # every machine is back; "tail" was adopted, "late" is new
    check(table, range(size), 7)
print(f"rank {rank}: SPARSE JOIN OK", flush=True)
bps.shutdown()
"""


def test_a_joined_machine_counts_as_an_empty_push_of_row_sparse_tables():
    result = run_job([sys.executable, "-c", SPARSE_UNEVEN], 3, 2, timeout=90)
    assert not result.timed_out, result.failures()
    assert all(code == 0 for code in result.codes.values()), result.failures()
    for rank in range(3):
        assert f"rank {rank}: SPARSE JOIN OK" in result.outputs[f"worker{rank}"], result.outputs[f"worker{rank}"]


def test_a_joined_machine_counts_as_zeros_until_every_machine_joined():
    result = run_job([sys.executable, "-c", UNEVEN], 3, 2, timeout=90, env={"BYTEPS_PARTITION_BYTES": "4000"})
    assert not result.timed_out, result.failures()
    assert all(code == 0 for code in result.codes.values()), result.failures()
    for rank in range(3):
        assert f"rank {rank}: JOIN OK" in result.outputs[f"worker{rank}"], result.outputs[f"worker{rank}"]
