"""Worker script: Horovod's collectives beyond allreduce for NDArrays (allgather, alltoall, reducescatter,
Min/Max/Product, objects, process sets, join), checked by every rank against a numpy reference; ranks that
disagree, failing on every rank and leaving the job usable; and the timeline rank 0 writes around a few
allreduces.

Run under bpslaunch with 2 ranks (or 4: 2 machines x 2 processes), BYTEPS_TEST_TMP naming a folder for the
timeline. Prints ``OK <check>`` per check and ``ALL OK <n>``; the first failure exits 1.
"""

from __future__ import annotations

import json
import os

import mxnet as mx
import numpy as np
from check_runner import Checks, assert_array, expect_error

import byteps.mxnet as bps

checks = Checks()
DTYPES = ["uint8", "int8", "int32", "int64", "float16", "float32", "float64"]


def block(r, rows, dtype):
    return ((np.arange(rows * 3).reshape(rows, 3) + 10 * r) % 100).astype(dtype)


def allgathers():
    r, n = bps.rank(), bps.size()
    for dtype in DTYPES:
        got = bps.allgather(mx.nd.array(block(r, r + 1, dtype), dtype=dtype), name=f"gather.{dtype}")
        assert_array(got, np.concatenate([block(k, k + 1, dtype) for k in range(n)]), f"allgather {dtype}")
    grouped = bps.grouped_allgather([mx.nd.ones((r + 1, 2)), mx.nd.zeros((1,))], name="gather.group")
    assert grouped[0].shape == (n * (n + 1) // 2, 2) and grouped[1].shape == (n,)
    assert bps.allgather_object({"rank": r}) == [{"rank": k} for k in range(n)]
    assert bps.broadcast_object(f"from {r}", root_rank=n - 1) == f"from {n - 1}"


def alltoall_and_reducescatter():
    r, n = bps.rank(), bps.size()
    splits = [k + 1 for k in range(n)]                   # rank r sends k + 1 rows to rank k
    rows = block(r, sum(splits), "float32")
    received, counts = bps.alltoall(mx.nd.array(rows), splits=splits, name="a2a")
    want = [block(k, sum(splits), "float32")[sum(splits[:r]):sum(splits[:r + 1])] for k in range(n)]
    assert_array(received, np.concatenate(want), "alltoall")
    assert counts.asnumpy().tolist() == [r + 1] * n, counts
    even = bps.alltoall(mx.nd.array(block(r, 2 * n, "float32")), name="a2a.even")  # Horovod: no splits, no counts
    assert isinstance(even, mx.nd.NDArray), type(even)
    assert_array(even, np.concatenate([block(k, 2 * n, "float32")[2 * r:2 * r + 2] for k in range(n)]), "even")
    # Bad splits fail before anything is sent, as MXNetError (Horovod's class) that is also a ValueError.
    for bad, text in ((mx.nd.ones((n,), dtype="float32"), "int32 array"), ([n] * n, "splits")):
        for kind in (mx.base.MXNetError, ValueError):
            expect_error(kind, text, lambda bad=bad: bps.alltoall(mx.nd.ones((n,)), splits=bad))
    x = block(r, 5, "float64")
    total = sum(block(k, 5, "float64") for k in range(n))
    counts = [5 // n + (k < 5 % n) for k in range(n)]   # Horovod's split: the first ranks get the extra rows
    first, count = sum(counts[:r]), counts[r]
    got = bps.reducescatter(mx.nd.array(x, dtype="float64"), name="rs", op=bps.Sum)
    assert_array(got, total[first:first + count], "reducescatter sum")
    for scatter in (lambda a: bps.reducescatter(a), lambda a: bps.grouped_reducescatter([a])):
        expect_error(ValueError, "scalar (0-d)", lambda scatter=scatter: scatter(mx.nd.array(r, dtype="float32")))
    got = bps.grouped_reducescatter([mx.nd.array(x, dtype="float64")], name="rs.group")[0]
    assert_array(got, (total / n)[first:first + count], "grouped reducescatter average")


def min_max_product():
    r, n = bps.rank(), bps.size()
    values = [np.array([3, -1, 4 + k, 2 * k], dtype="int32") for k in range(n)]
    x = mx.nd.array(values[r], dtype="int32")
    assert_array(bps.allreduce(x, op=bps.Max, name="max"), np.max(values, axis=0), "Max")
    assert_array(bps.allreduce(x, op=bps.Min, name="min"), np.min(values, axis=0), "Min")
    assert_array(bps.allreduce(x, op=bps.Product, name="prod"), np.prod(values, axis=0).astype("int32"), "Product")
    expect_error(ValueError, "op=Average or Sum", lambda: bps.allreduce(x, op=bps.Max, prescale_factor=2.0))
    # Horovod's grouped_allreduce: new arrays (inputs untouched) or in place; Max reduces each from every rank
    arrays = [mx.nd.array(block(r, k + 1, "float32")) for k in range(3)]
    summed = bps.grouped_allreduce(arrays, op=bps.Sum, name="grouped")
    for k, (got, given) in enumerate(zip(summed, arrays)):
        assert_array(got, sum(block(j, k + 1, "float32") for j in range(n)), f"grouped sum {k}")
        assert_array(given, block(r, k + 1, "float32"), f"grouped input {k} untouched")
    averaged = bps.grouped_allreduce_(arrays, name="grouped.inplace")
    assert all(a is b for a, b in zip(averaged, arrays))
    for k, got in enumerate(arrays):
        assert_array(got, sum(block(j, k + 1, "float32") for j in range(n)) / n, f"grouped average {k}")
    largest = bps.grouped_allreduce([x, x * 2], op=bps.Max, name="grouped.max")
    assert_array(largest[1], 2 * np.max(values, axis=0), "grouped Max")


def process_sets():
    r, n = bps.rank(), bps.size()
    alone = bps.add_process_set([r for r in range(n) if r == n - 1])   # one rank's set
    if r == n - 1:
        got = bps.allgather(mx.nd.ones((2,)) * r, name="set.gather", process_set=alone)
        assert_array(got, np.full((2,), float(r), dtype="float32"), "allgather in a one-rank set")
    else:
        expect_error(ValueError, "not in", lambda: bps.allgather(mx.nd.ones((2,)), process_set=alone))
    bps.remove_process_set(alone)
    assert not bps.mpi_built() and not bps.gloo_built()


def reductions_over_process_sets():
    r, n = bps.rank(), bps.size()
    singles = [bps.add_process_set([k]) for k in range(n)]   # one set per rank, all reducing the same name
    mine = singles[r]
    x = mx.nd.array(block(r, 2, "float32"))
    assert_array(bps.allreduce(x, name="set.sum", op=bps.Sum, process_set=mine), block(r, 2, "float32"),
                 "sum over a one-rank set: this rank's own, not waiting for the others")
    expect_error(ValueError, "not in", lambda: bps.allreduce(x, process_set=singles[(r + 1) % n]))
    pair = bps.global_process_set  # every rank (with 2 ranks no other set has more than one)
    ints = mx.nd.array(block(r, 2, "int32") - 5 * r, dtype="int32")
    want = sum(block(k, 2, "int32") - 5 * k for k in range(n))
    assert_array(bps.allreduce(ints, name="set.ints", op=bps.Sum, process_set=pair), want, "int sum in a set")
    y = mx.nd.array(block(r, 3, "float64"), dtype="float64")
    bps.allreduce_(y, name="set.avg", process_set=pair)
    assert_array(y, sum(block(k, 3, "float64") for k in range(n)) / n, "average in place in a set")
    grouped = bps.grouped_allreduce([x, x * 2], op=bps.Sum, name="set.grouped", process_set=pair)
    assert_array(grouped[1], 2 * sum(block(k, 2, "float32") for k in range(n)), "grouped sum in a set")
    for dtype in ("int32", "float32"):
        got = bps.broadcast(mx.nd.ones((4,), dtype=dtype) * r, root_rank=n - 1, name=f"set.bcast.{dtype}",
                            process_set=pair)
        assert_array(got, np.full((4,), n - 1, dtype=dtype), f"broadcast {dtype} in a set")
    z = mx.nd.ones((3,)) * r
    bps.broadcast_(z, root_rank=0, name="set.bcast.inplace", process_set=pair)
    assert_array(z, np.zeros((3,), dtype="float32"), "broadcast_ in a set")
    if r == n - 1:
        expect_error(ValueError, "root_rank 0 is not in",
                     lambda: bps.broadcast(z, root_rank=0, process_set=singles[n - 1]))
    # Ranks that name different roots fail on every rank (Horovod's broadcast rank error)
    expect_error(mx.base.MXNetError, "root", lambda: bps.broadcast(z, root_rank=r, name="set.roots").asnumpy())
    assert_array(bps.broadcast(z + r, root_rank=n - 1, name="set.roots.after", process_set=pair),
                 np.full((3,), n - 1, dtype="float32"), "a broadcast after a failed one")
    # DistributedOptimizer over a set: averaged within it; alone in a set, a rank keeps its gradient
    for process_set, averaged in ((pair, True), (mine, False)):
        opt = bps.DistributedOptimizer(mx.optimizer.SGD(learning_rate=1.0), process_set=process_set)
        w = mx.nd.zeros((5,))
        g = mx.nd.ones((5,)) * (r + 1)
        opt.update(7, w, g, opt.create_state(7, w))
        expected = -(sum(range(1, n + 1)) / n if averaged else r + 1)
        assert_array(w, np.full((5,), expected, dtype="float32"), f"DistributedOptimizer averaged={averaged}")
    # DistributedTrainer over a set: starts from the root's parameters and averages within the set; alone in
    # a set, a rank keeps its own parameters and gradient
    for process_set, averaged in ((pair, True), (mine, False)):
        net = mx.gluon.nn.Dense(3, in_units=2, use_bias=False, prefix=f"setnet{int(averaged)}_")
        net.initialize(mx.init.Constant(float(r)))
        trainer = bps.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 1.0},
                                         root_rank=0 if averaged else r, process_set=process_set)
        start = 0.0 if averaged else float(r)
        assert_array(net.weight.data(), np.full((3, 2), start, dtype="float32"), f"trainer start {averaged}")
        with mx.autograd.record():
            loss = net(mx.nd.ones((1, 2)) * (r + 1)).sum()
        loss.backward()
        trainer.step(1)
        gradient = sum(range(1, n + 1)) / n if averaged else r + 1
        assert_array(net.weight.data(), np.full((3, 2), start - gradient, dtype="float32"),
                     f"DistributedTrainer averaged={averaged}")
    if r == 0:
        expect_error(ValueError, "compression_params",
                     lambda: bps.DistributedTrainer(mx.gluon.nn.Dense(1, in_units=1).collect_params(), "sgd",
                                                    compression_params={"fp16": True}, process_set=pair))
    for process_set in singles:
        bps.remove_process_set(process_set)


def uneven_join():
    r, n = bps.rank(), bps.size()
    for step in range(2 + r):
        y = bps.allreduce(mx.nd.ones((3,)) * (r + 1), op=bps.Sum, name="uneven")
        want = float(sum(k + 1 for k in range(n) if 2 + k > step))
        assert_array(y, np.full((3,), want, dtype="float32"), f"step {step}")
    assert bps.join() == n - 1
    y = bps.allreduce(mx.nd.ones((2,)) * r, op=bps.Sum, name="after.join")
    assert_array(y, np.full((2,), float(sum(range(n))), dtype="float32"), "after join")


def failures_leave_the_job_usable():
    """Ranks that disagree fail on every rank, with both sides named, and the next op of the kind works."""
    r, n = bps.rank(), bps.size()

    def fails(text, call, *named):
        message = expect_error(bps.PushPullError, text, call)
        assert all(part in message for part in named), message

    fails("ranks disagree on the shape after the first dimension",
          lambda: bps.allgather(mx.nd.ones((2, 3 + r)), name="bad.cols"), "rank 0 has (3,)", "rank 1 has (4,)")
    fails("ranks disagree on the dtype",
          lambda: bps.allgather(mx.nd.ones((2,), dtype="float32" if r else "int32"), name="bad.dtype"),
          "rank 0 has int32", "rank 1 has float32")
    got = bps.allgather(mx.nd.ones((1, 3)) * r, name="good.gather")
    assert_array(got, np.concatenate([np.full((1, 3), k, "float32") for k in range(n)]), "allgather after")
    fails("ranks disagree on the shape after the first dimension",
          lambda: bps.alltoall(mx.nd.ones((n, 1 + r)), name="bad.a2a"), "rank 0 has (1,)", "rank 1 has (2,)")
    got = bps.alltoall(mx.nd.array(block(r, n, "float32")), name="good.a2a")
    assert_array(got, np.concatenate([block(k, n, "float32")[r:r + 1] for k in range(n)]), "alltoall after")
    # With several processes per machine each machine's ranks meet first, and each machine names its own pair.
    low = r - bps.local_rank() if bps.local_size() > 1 else 0
    fails("mismatch for", lambda: bps.reducescatter(mx.nd.ones((n, 1 + r)), name="bad.rs"),
          f"'bad.rs' (shape {n}x{1 + low}", f"'bad.rs' (shape {n}x{2 + low}")
    got = bps.reducescatter(mx.nd.array(block(r, n, "float32")), name="good.rs", op=bps.Sum)
    assert_array(got, sum(block(k, n, "float32") for k in range(n))[r:r + 1], "reducescatter after")
    fails("ranks disagree on the shape", lambda: bps.allreduce(mx.nd.ones((2 + r,)), op=bps.Max, name="bad.max"),
          "rank 0 has (2,)", "rank 1 has (3,)")
    got = bps.allreduce(mx.nd.array([r, -r], dtype="int32"), op=bps.Max, name="good.max")
    assert_array(got, np.array([n - 1, 0], "int32"), "Max after")


def timeline():
    """Horovod's start_timeline/stop_timeline: rank 0 writes Chrome-trace JSON of the push_pulls in between."""
    r, n = bps.rank(), bps.size()
    path = os.path.join(os.environ["BYTEPS_TEST_TMP"], "timeline.json")
    expect_error(ValueError, "file_path must not be empty", lambda: bps.start_timeline(""))
    bps.start_timeline(path)
    for step in range(2):
        for name in ("timeline.a", "timeline.b"):
            y = bps.allreduce(mx.nd.ones((1000,)) * (r + step), name=name, op=bps.Sum)
            assert_array(y, np.full((1000,), float(sum(k + step for k in range(n))), "float32"), f"{name} {step}")
    mx.nd.waitall()  # MXNet runs the ops later: the trace holds only what ran before the stop
    bps.stop_timeline()
    after = bps.allreduce(mx.nd.ones((1000,)), name="timeline.after", op=bps.Sum)
    assert_array(after, np.full((1000,), float(n), "float32"), "after the timeline")
    if r != 0:
        return  # Horovod's coordinator alone writes the timeline
    with open(path) as handle:
        trace = json.load(handle)
    events = trace["traceEvents"]
    assert isinstance(events, list) and events, trace
    for event in events:
        assert event["ph"] in ("X", "M") and isinstance(event["name"], str) and event["pid"] == 0, event
        if event["ph"] == "X":
            assert event["ts"] > 0 and event["dur"] >= 0 and isinstance(event["tid"], int), event
    spans = [e for e in events if e["ph"] == "X"]
    tensors = sorted((e["name"], e["args"]["step"]) for e in spans if e["cat"] == "tensor")
    assert tensors == [("timeline.a", 1), ("timeline.a", 2), ("timeline.b", 1), ("timeline.b", 2)], tensors
    for name in ("timeline.a", "timeline.b"):  # and their routes: push and pull where a server sums them
        route = {e["cat"] for e in spans if e["name"] == name} - {"tensor"}
        want = {"push", "pull"} if bps.local_size() == 1 else set()
        assert route and route >= want, (name, route)
    assert {e["name"] for e in spans} == {"timeline.a", "timeline.b"}, spans  # not "timeline.after"


def main():
    bps.init()
    checks.run("allgather of every dtype, grouped, objects", allgathers)
    checks.run("alltoall and reducescatter", alltoall_and_reducescatter)
    checks.run("Min, Max, Product, grouped_allreduce", min_max_product)
    checks.run("process sets and build flags", process_sets)
    checks.run("allreduce, broadcast, DistributedOptimizer and DistributedTrainer over process sets",
               reductions_over_process_sets)
    checks.run("join with uneven data", uneven_join)
    checks.run("failed collectives: every rank fails, and the next one works", failures_leave_the_job_usable)
    checks.run("timeline: rank 0 writes the push_pulls between start and stop", timeline)
    mx.nd.waitall()
    bps.shutdown()
    checks.done()


if __name__ == "__main__":
    main()
