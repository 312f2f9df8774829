"""Worker script: Horovod's collectives beyond allreduce (allgather, alltoall, reducescatter, Min/Max/Product,
grouped ops, objects, sparse allreduce, process sets, re-init), checked by every rank against a reference.

Run under bpslaunch with 2 or 4 ranks. Every rank's input is derived from
its rank, so each rank computes the exact expected result itself with
torch. Prints ``OK <check>`` per check and ``ALL OK <n>``; the first
failure exits 1. With 4 ranks, ``OUTSIDER_FILE`` (a path) lets the
process-set check prove that a set's collectives never wait for a rank
outside it: that rank waits for the file, which the members write after
their collectives finished.
"""

from __future__ import annotations

import json
import os
import time

import torch
from check_runner import Checks, assert_equal, expect_error

import byteps.torch as bps

checks = Checks()


def equal(actual, expected, what="result"):
    assert_equal(actual, expected, what)
DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64, torch.bool]


def rows_of(r):
    return r + 1   # rank r sends r + 1 rows: the first dimension differs by rank


def block(r, rows, dtype, cols=3):
    values = (torch.arange(rows * cols).reshape(rows, cols) + 10 * r) % 100
    return (values % 2).to(dtype) if dtype == torch.bool else values.to(dtype)


def allgather():
    n, r = bps.size(), bps.rank()
    for dtype in DTYPES:
        got = bps.allgather(block(r, rows_of(r), dtype), name=f"ag.{dtype}")
        want = torch.cat([block(k, rows_of(k), dtype) for k in range(n)])
        assert got.dtype == dtype and torch.equal(got, want), (dtype, got, want)
    empty = bps.allgather(torch.zeros(0 if r == 0 else 2, 4), name="ag.empty")   # rank 0 sends no rows
    assert empty.shape == (2 * (n - 1), 4), empty.shape
    handles = [bps.allgather_async(torch.full((2,), float(r + i)), name=f"ag.async.{i}") for i in range(5)]
    for i, handle in enumerate(handles):
        equal(bps.synchronize(handle), torch.tensor([float(k + i) for k in range(n) for _ in range(2)]))
    grouped = bps.grouped_allgather([torch.full((1,), r), torch.full((r + 1, 2), 1.0)], name="ag.grouped")
    equal(grouped[0], torch.arange(n))
    assert grouped[1].shape == (n * (n + 1) // 2, 2)
    assert bps.allgather_object({"rank": r}) == [{"rank": k} for k in range(n)]
    # An async collective never waits at the call: rank 0 starts one before a barrier the others
    # pass first, as Horovod's tests do (it would deadlock if the call waited for them).
    if r == 0:
        early = bps.allgather_async(torch.ones(1), name="ag.early")
    bps.barrier()
    if r != 0:
        early = bps.allgather_async(torch.ones(1), name="ag.early")
    equal(bps.synchronize(early), torch.ones(n))


def allgather_gradient():
    r = bps.rank()
    x = torch.full((rows_of(r), 2), 1.0, requires_grad=True)
    out = bps.allgather(x, name="ag.grad")
    (out * (torch.arange(out.shape[0]).reshape(-1, 1) + 1.0)).sum().backward()
    first = sum(rows_of(k) for k in range(r))
    want = (torch.arange(first, first + rows_of(r)).reshape(-1, 1) + 1.0).expand(-1, 2)
    equal(x.grad, want)   # every rank weighs the same rows alike: the average is that weight


def alltoall():
    n, r = bps.size(), bps.rank()
    splits = [k + 1 for k in range(n)]   # rank r sends k + 1 rows to rank k
    send = torch.cat([torch.full((k + 1, 2), float(10 * r + k)) for k in range(n)])
    got, received = bps.alltoall(send, splits=torch.tensor(splits, dtype=torch.int32), name="a2a")
    equal(received, torch.full((n,), r + 1, dtype=torch.int32))
    equal(got, torch.cat([torch.full((r + 1, 2), float(10 * k + r)) for k in range(n)]))
    even = bps.alltoall(torch.arange(2 * n) + 100 * r, name="a2a.even")
    equal(even, torch.tensor([100 * k + 2 * r + j for k in range(n) for j in range(2)]))
    x = torch.ones(2 * n, requires_grad=True)
    (bps.alltoall(x, name="a2a.grad") * 3).sum().backward()
    equal(x.grad, torch.full((2 * n,), 3.0))


def reducescatter():
    n, r = bps.size(), bps.rank()
    rows = 2 * n + 1   # uneven: the first rank gets one more row
    for dtype in (torch.int32, torch.int64, torch.float16, torch.float32, torch.float64):
        x = (torch.arange(rows * 3).reshape(rows, 3) + r).to(dtype)
        total = sum((torch.arange(rows * 3).reshape(rows, 3) + k).to(torch.float64) for k in range(n))
        counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
        first = sum(counts[:r])
        got = bps.reducescatter(x, op=bps.Sum, name=f"rs.{dtype}")
        equal(got, total[first:first + counts[r]].to(dtype))
        if dtype.is_floating_point:
            got = bps.reducescatter(x, name=f"rs.avg.{dtype}", prescale_factor=2.0, postscale_factor=0.5)
            equal(got, (total[first:first + counts[r]] / n).to(dtype))
    parts = bps.grouped_reducescatter([torch.ones(n, 2), torch.ones(2 * n)], op=bps.Sum, name="rs.grouped")
    equal(parts[0], torch.full((1, 2), float(n)))
    equal(parts[1], torch.full((2,), float(n)))
    expect_error(NotImplementedError, "Average or Sum", lambda: bps.reducescatter(torch.ones(n), op=bps.Adasum))
    expect_error(ValueError, "scalar", lambda: bps.reducescatter(torch.tensor(1.0)))


def min_max_product():
    n, r = bps.size(), bps.rank()
    x = torch.tensor([float(r), -float(r), 2.0, r + 1.0])
    equal(bps.allreduce(x, op=bps.Min, name="mmp"), torch.tensor([0.0, -(n - 1.0), 2.0, 1.0]))
    equal(bps.allreduce(x, op=bps.Max, name="mmp"), torch.tensor([n - 1.0, 0.0, 2.0, float(n)]))
    product = torch.tensor([0.0, 0.0, 2.0 ** n, float(torch.arange(1, n + 1).prod())])
    equal(bps.allreduce(x, op=bps.Product, name="mmp"), product)
    ints = torch.tensor([r, 5 - r], dtype=torch.int32)
    equal(bps.allreduce_(ints, op=bps.Max, name="mmp.int"), torch.tensor([n - 1, 5], dtype=torch.int32))
    expect_error(ValueError, "supersedes", lambda: bps.allreduce(x, op=bps.Max, average=True))


def grouped_allreduce():
    n, r = bps.size(), bps.rank()
    tensors = [torch.full((3,), float(r)), torch.full((2, 2), r + 1.0)]
    out = bps.grouped_allreduce(tensors, op=bps.Sum, name="gar")
    equal(out[0], torch.full((3,), float(sum(range(n)))))
    equal(out[1], torch.full((2, 2), float(sum(range(1, n + 1)))))
    same = bps.grouped_allreduce_(tensors, name="gar.inplace")
    assert same[0] is tensors[0] and torch.allclose(tensors[0], torch.full((3,), (n - 1) / 2))


def sparse_allreduce():
    n, r = bps.size(), bps.rank()
    dense = torch.zeros(6, 2)
    dense[r] = r + 1.0
    dense[5] = 1.0
    handle = bps.sparse_allreduce_async(dense.to_sparse(), name="sparse", op=bps.Sum)
    total = handle().to_dense()
    want = torch.zeros(6, 2)
    for k in range(n):
        want[k] = k + 1.0
    want[5] = float(n)
    equal(total, want)


def mismatches():
    """Ranks that disagree fail on every rank, with both sides named."""
    r = bps.rank()
    text = expect_error(RuntimeError, "shape after the first dimension",
                        lambda: bps.allgather(torch.ones(2, 3 + r), name="bad.cols"))
    assert "rank 0 has (3,)" in text and "rank 1 has (4,)" in text, text
    text = expect_error(RuntimeError, "dtype",
                        lambda: bps.allgather(torch.ones(2, dtype=torch.float32 if r else torch.int32), name="bad.dt"))
    assert "torch.int32" in text and "torch.float32" in text, text
    text = expect_error(RuntimeError, "broadcasts from rank",
                        lambda: bps.broadcast(torch.ones(3), root_rank=min(r, 1), name="bad.root"))
    assert "broadcasts from rank 0" in text and "broadcasts from rank 1" in text, text
    expect_error(ValueError, "pass splits", lambda: bps.alltoall(torch.ones(3), name="bad.split"))
    expect_error(ValueError, "is not registered", lambda: bps.allreduce(torch.ones(1), process_set=bps.ProcessSet([0])))
    expect_error(ValueError, "not ranks of this job", lambda: bps.add_process_set([0, bps.size()]))
    bps.barrier()


def process_sets():
    n, r = bps.size(), bps.rank()
    evens = bps.add_process_set([k for k in range(n) if k % 2 == 0])
    odds = bps.add_process_set([k for k in range(n) if k % 2 == 1])
    mine = evens if r % 2 == 0 else odds
    assert mine.included() and mine.rank() == r // 2 and mine.size() == len(mine.ranks)
    want = float(sum(mine.ranks))
    equal(bps.allreduce(torch.tensor([float(r)]), op=bps.Sum, name="ps.sum", process_set=mine),
                 torch.tensor([want]))
    gathered = bps.allgather(torch.tensor([r]), name="ps.ag", process_set=mine)
    equal(gathered, torch.tensor(mine.ranks))
    root = mine.ranks[-1]
    equal(bps.broadcast(torch.tensor([float(r)]), root, name="ps.bc", process_set=mine), torch.tensor([root * 1.0]))
    assert bps.broadcast_object(r, root_rank=root, process_set=mine) == root
    bps.barrier(process_set=mine)
    other = odds if mine is evens else evens
    expect_error(ValueError, "is not in", lambda: bps.allreduce(torch.ones(1), name="ps.out", process_set=other))
    expect_error(ValueError, "exists already", lambda: bps.add_process_set(list(mine.ranks)))
    assert bps.remove_process_set(odds) and bps.remove_process_set(evens) and not bps.remove_process_set(evens)
    expect_error(ValueError, "is not registered", lambda: bps.allreduce(torch.ones(1), process_set=mine))
    bps.barrier()


def sets_do_not_wait_for_outsiders():
    """With 4 ranks: ranks 0..2 run set collectives while rank 3 waits for them to finish first."""
    n, r = bps.size(), bps.rank()
    marker = os.environ.get("OUTSIDER_FILE")
    if n < 4 or not marker:
        return
    first_three = bps.add_process_set([0, 1, 2])
    across = bps.add_process_set([1, 2])   # one rank on each machine (2 machines of 2 ranks)
    if r == 3:
        deadline = time.monotonic() + 60
        while not os.path.exists(marker):
            assert time.monotonic() < deadline, "the set's ranks never finished: they waited for rank 3"
            time.sleep(0.05)
    else:
        for step in range(3):
            got = bps.allreduce(torch.tensor([float(r + step)]), op=bps.Sum, name="three", process_set=first_three)
            equal(got, torch.tensor([float(3 + 3 * step)]))
        if r in (1, 2):
            equal(bps.allgather(torch.tensor([r]), name="across", process_set=across), torch.tensor([1, 2]))
        bps.barrier(process_set=first_three)
        if r == 0:
            open(marker, "w").close()
    bps.remove_process_set(across)
    bps.remove_process_set(first_three)
    bps.barrier()


def unnamed_calls_reuse_names():
    """Unnamed calls cycle through a few names: the worker declares a bounded number of tensors."""
    from byteps.common import api
    worker = api.worker()
    before = len(worker.registry.tensor_ids)
    for i in range(200):
        bps.allreduce(torch.tensor([float(i)]))
    grown = len(worker.registry.tensor_ids) - before
    assert grown <= 16, f"200 unnamed allreduces declared {grown} tensors"


def reinit():
    r, n = bps.rank(), bps.size()
    bps.shutdown()
    assert not bps.is_initialized()
    expect_error(ValueError, "init", lambda: bps.allreduce(torch.ones(1), name="after.shutdown"))
    bps.init()
    assert bps.is_initialized() and (bps.rank(), bps.size()) == (r, n)
    equal(bps.allreduce(torch.ones(1), op=bps.Sum, name="after.reinit"), torch.tensor([float(n)]))


def build_flags():
    assert not any(f() for f in (bps.mpi_built, bps.gloo_built, bps.nccl_built, bps.ddl_built, bps.ccl_built,
                                 bps.cuda_built, bps.rocm_built, bps.mpi_enabled))
    expect_error(ValueError, "file_path must not be empty", lambda: bps.start_timeline(""))


def timeline():
    path = os.path.join(os.environ["BYTEPS_TEST_TMP"], "timeline.json")
    bps.start_timeline(path)
    for _ in range(2):
        bps.allreduce(torch.ones(1000), name="timeline.traced")
    bps.stop_timeline()
    bps.allreduce(torch.ones(1000), name="timeline.after")
    if bps.rank() != 0:
        return  # Horovod's coordinator alone writes the timeline
    with open(path) as handle:
        spans = [e for e in json.load(handle)["traceEvents"] if e["ph"] == "X"]
    tensors = [(e["name"], e["args"]["step"]) for e in spans if e["cat"] == "tensor"]
    assert len(tensors) == 2 and all("timeline.traced" in name for name, _ in tensors), tensors
    assert not any("timeline.after" in e["name"] for e in spans), spans


def main():
    bps.init()
    checks.run("allgather (dtypes, uneven rows, empty, async, grouped, objects)", allgather)
    checks.run("timeline", timeline)
    checks.run("allgather gradient", allgather_gradient)
    checks.run("alltoall (splits, even, gradient)", alltoall)
    checks.run("reducescatter (dtypes, uneven rows, scaling, grouped, errors)", reducescatter)
    checks.run("allreduce Min, Max, Product", min_max_product)
    checks.run("grouped allreduce", grouped_allreduce)
    checks.run("sparse allreduce", sparse_allreduce)
    checks.run("mismatches fail on every rank", mismatches)
    checks.run("process sets", process_sets)
    checks.run("process sets do not wait for outsiders", sets_do_not_wait_for_outsiders)
    checks.run("unnamed calls reuse names", unnamed_calls_reuse_names)
    checks.run("shutdown and init again", reinit)
    checks.run("build flags and timeline", build_flags)
    bps.shutdown()
    checks.done()


if __name__ == "__main__":
    main()
