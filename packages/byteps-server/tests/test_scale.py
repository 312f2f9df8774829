"""Scale: 10,000 declared tensors in one job, and one 1 GB tensor."""

import sys

from byteps.testkit import run_job

MANY = r"""
import numpy as np
import byteps.common as bps
bps.init()
rank, size = bps.rank(), bps.size()
names = [f"t{i}" for i in range(10_000)]
for name in names:
    bps.declare(name)
tensors = [np.full(4, rank + i % 7, dtype=np.float32) for i in range(len(names))]
handles = [bps.push_pull_async(t, name=n, average=False) for t, n in zip(tensors, names)]
for i, h in enumerate(handles):
    got = bps.synchronize(h)
    expected = sum(r + i % 7 for r in range(size))
    assert np.all(got == expected), (names[i], got, expected)
print(f"rank {rank}: 10000 tensors OK", flush=True)
"""

HUGE = r"""
import numpy as np
import byteps.common as bps
bps.init()
rank, size = bps.rank(), bps.size()
x = np.full(250_000_000, rank + 1, dtype=np.float32)       # 1 GB
bps.push_pull(x, name="huge", average=False)
expected = size * (size + 1) / 2
assert x[0] == expected and x[-1] == expected and x[123_456_789] == expected
assert np.count_nonzero(x != expected) == 0
print(f"rank {rank}: 1 GB tensor OK", flush=True)
"""


def test_ten_thousand_declared_tensors():
    result = run_job([sys.executable, "-c", MANY], 2, 2, timeout=300)
    assert all(code == 0 for code in result.codes.values()), result.failures()
    assert "rank 1: 10000 tensors OK" in result.outputs["worker1"]


def test_one_gigabyte_tensor():
    result = run_job([sys.executable, "-c", HUGE], 2, 2, timeout=300)
    assert all(code == 0 for code in result.codes.values()), result.failures()
    assert "rank 0: 1 GB tensor OK" in result.outputs["worker0"]
