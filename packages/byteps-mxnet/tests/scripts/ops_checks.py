"""Worker script: push_pull, allreduce and broadcast of NDArrays, and how they meet MXNet's engine.

Run under bpslaunch with 2 ranks (or 4: 2 machines x 2 processes). Every rank builds every rank's input from
seeds, so it can compute the exact expected result itself.
"""

from __future__ import annotations

import itertools
import os

import mxnet as mx
import numpy as np
from check_runner import Checks, assert_array, expect_error

import byteps.mxnet as bps
from byteps.common import api
from byteps.mxnet.ops import allreduce_group_

FLOATS = ["float16", "float32", "float64"]
SHAPES = [(), (17,), (17, 17), (17, 17, 17)]  # ranks 0-3, as in BytePS's test_mxnet.py
RTOL = {"float16": 1e-3, "float32": 1e-6, "float64": 1e-12, "int32": 0, "int64": 0}
#: Under MXNet's NaiveEngine every op runs inside the call that issues it.
NAIVE = os.environ.get("MXNET_ENGINE_TYPE") == "NaiveEngine"
checks = Checks()


def value(shape, dtype, r, case):
    rng = np.random.RandomState(1000 * case + r)
    if dtype.startswith("float"):
        return rng.uniform(-100, 100, size=shape).astype(dtype)
    return rng.randint(-1000, 1000, size=shape).astype(dtype)


def reduced(shape, dtype, case, average):
    """What byteps computes: each machine's sum (float16 summed in float32 and rounded), then the machines' sums
    summed on the servers (rounded once more); integers floor-divided."""
    inputs = [value(shape, dtype, r, case) for r in range(bps.size())]
    wide = np.float32 if dtype == "float16" else dtype
    local = bps.local_size()  # a machine's ranks are consecutive
    machines = [np.sum([x.astype(wide) for x in inputs[m:m + local]], axis=0).astype(dtype)
                for m in range(0, len(inputs), local)]
    total = np.sum([x.astype(wide) for x in machines], axis=0).astype(dtype)
    if dtype == "float16":
        return (total.astype(np.float32) / bps.size()).astype(np.float16) if average else total
    if not average:
        return total
    return (total // bps.size()).astype(dtype) if dtype.startswith("int") else (total / bps.size()).astype(dtype)


def ndarray(array):
    with mx.util.np_shape(True):  # 0-d NDArrays exist with numpy shape semantics only
        return mx.nd.array(array, dtype=array.dtype)


def info():
    print(f"INFO rank={bps.rank()} size={bps.size()} local_rank={bps.local_rank()} "
          f"local_size={bps.local_size()}", flush=True)


def push_pull_floats():
    r = bps.rank()
    for case, (dtype, shape) in enumerate(itertools.product(FLOATS, SHAPES)):
        tag = f"{dtype}.{len(shape)}d"
        for average in (True, False):
            x = ndarray(value(shape, dtype, r, case))
            bps.byteps_declare_tensor(f"tensor_{tag}_{average}")
            assert bps.byteps_push_pull(x, name=f"tensor_{tag}_{average}", is_average=average) is None
            assert_array(x, reduced(shape, dtype, case, average), f"byteps_push_pull {tag} average={average}",
                         rtol=RTOL[dtype])
        source = ndarray(value(shape, dtype, r, case))
        y = bps.allreduce(source, name=f"allreduce_{tag}")
        assert_array(y, reduced(shape, dtype, case, True), f"allreduce {tag}", rtol=RTOL[dtype])
        assert_array(source, value(shape, dtype, r, case), f"allreduce {tag} left its input alone")
        z = ndarray(value(shape, dtype, r, case))
        assert bps.allreduce_(z, op=bps.Sum, name=f"allreduce__{tag}") is z
        assert_array(z, reduced(shape, dtype, case, False), f"allreduce_ {tag} op=Sum", rtol=RTOL[dtype])


def push_pull_integers_and_numpy_arrays():
    r = bps.rank()
    for case, dtype in enumerate(["int32", "int64"], start=100):
        for average in (True, False):
            x = ndarray(value((5, 3), dtype, r, case))
            bps.byteps_push_pull(x, name=f"int.{dtype}.{average}", is_average=average)
            assert_array(x, reduced((5, 3), dtype, case, average), f"{dtype} average={average}")
    for case, shape in enumerate(SHAPES, start=200):  # MXNet's numpy interface, 0-d included
        x = mx.np.array(value(shape, "float32", r, case), dtype="float32")
        y = bps.allreduce(x, name=f"np.{len(shape)}d", average=False)
        assert isinstance(y, mx.np.ndarray), type(y)
        assert_array(y, reduced(shape, "float32", case, False), f"mx.np {shape}", rtol=1e-6)
    empty = ndarray(np.zeros((0,), np.float32))
    assert_array(bps.allreduce(empty, name="empty"), np.zeros((0,), np.float32), "zero-size array")


def broadcasts():
    r = bps.rank()
    for root in sorted({0, bps.size() - 1}):
        for dtype in ["float16", "float32", "float64", "int32", "int64", "uint8", "int8"]:
            for shape in SHAPES[1:]:
                tag = f"{dtype}.{len(shape)}d.root{root}"
                want = np.abs(value(shape, "int64", root, 300)).astype(dtype) if dtype.endswith("int8") \
                    else value(shape, dtype, root, 300)
                mine = np.abs(value(shape, "int64", r, 300)).astype(dtype) if dtype.endswith("int8") \
                    else value(shape, dtype, r, 300)
                x = ndarray(mine)
                assert_array(bps.broadcast(x, root, name=f"b.{tag}"), want, f"broadcast {tag}")
                assert_array(x, mine, f"broadcast {tag} left its input alone")
                assert bps.broadcast_(x, root, name=f"b_.{tag}") is x
                assert_array(x, want, f"broadcast_ {tag}")
        nan = mx.nd.array([np.nan, 1.0]) if r != root else mx.nd.array([2.0, 3.0])
        bps.broadcast_(nan, root, name=f"nan.root{root}")  # the others' NaNs must not leak into the sum
        assert_array(nan, np.array([2.0, 3.0], np.float32), "broadcast_ over NaN")
        flags = mx.np.array([r == root, True, False], dtype="bool")
        assert_array(bps.broadcast(flags, root, name=f"bool.root{root}"), np.array([True, True, False]), "bool")


def engine_order():
    """Ops return at once, wait for the pending writes of their inputs, and later ops see their results."""
    r, n = bps.rank(), bps.size()
    # Rank 1 issues "gate" only after a barrier that rank 0 reaches after issuing everything
    # below: if any of rank 0's calls waited for a result, the job would deadlock.
    w = mx.nd.ones((1000,)) * (r + 1)
    if r != 0:
        api.barrier()
    gated = bps.allreduce(w, name="gate", average=False)   # pending until every rank issued it
    gated += 1                                               # a pending write ...
    bps.byteps_push_pull(gated, name="after_gate", is_average=False)   # ... that the push_pull waits for
    doubled = gated * 2                                      # sees the push_pull's result
    bps.byteps_push_pull(doubled, name="chained", is_average=True)     # waits for both
    if r == 0:
        api.barrier()
    s = sum(k + 1 for k in range(n))
    assert_array(gated, np.full(1000, (s + 1) * n, np.float32), "push_pull after a pending write")
    assert_array(doubled, np.full(1000, 2 * (s + 1) * n, np.float32), "an op issued after the push_pull")


def fused_groups_keep_issue_order():
    """A fused group's bucket gets its id in issue order, whenever the engine runs the group.

    Rank 1's group waits for a slow product while the program issues the
    next push_pull; rank 0's group runs at once. A bucket declared when the
    engine ran it took the next id on rank 0 but the one after "group.after"
    on rank 1: the ranks then disagreed on both tensors and the job hung.
    """
    r, n = bps.rank(), bps.size()
    slow = mx.nd.ones((1,)) * (r + 1)
    if r == 1:
        m = mx.nd.ones((1500, 1500)) / 1500
        for _ in range(6):
            m = mx.nd.dot(m, m)
        slow = (m[0, :1] * 0 + 1) * (r + 1)  # written only when the products are done
    pair = [slow, mx.nd.ones((3,)) * (r + 1)]
    allreduce_group_(pair, ["group.slow", "group.small"], average=False)
    if r != 1:
        api.barrier()  # rank 1 comes once its products are done: the others' engines ran the group by then
    after = bps.allreduce(mx.nd.ones((2,)) * (r + 1), name="group.after", average=False)
    if r == 1:
        m.wait_to_read()
        api.barrier()
    s = sum(k + 1 for k in range(n))
    assert_array(pair[0], np.full(1, s, np.float32), "the slow member")
    assert_array(pair[1], np.full(3, s, np.float32), "the small member")
    assert_array(after, np.full(2, s, np.float32), "the push_pull issued after the group")


def same_name_in_issue_order():
    r = bps.rank()
    arrays = [mx.nd.ones((4,)) * (10 * k + r) for k in range(4)]
    for a in arrays:  # one name, four arrays, issued back to back without waiting
        bps.byteps_push_pull(a, name="same", is_average=False)
    for k, a in enumerate(arrays):
        assert_array(a, np.full(4, sum(10 * k + q for q in range(bps.size())), np.float32), f"round {k}")
    x = mx.nd.ones((3,)) * r
    for _ in range(5):  # one array, in place, five times
        bps.byteps_push_pull(x, name="again", is_average=False)
    assert_array(x, np.full(3, sum(range(bps.size())) * bps.size() ** 4, np.float32), "five rounds in place")


def many_tensors_with_priorities():
    r = bps.rank()
    arrays = [mx.nd.arange(3000) * (k + 1) + r for k in range(30)]
    for k, a in enumerate(arrays):
        bps.byteps_push_pull(a, name=f"prio.{k}", priority=-k)
    for k, a in enumerate(arrays):
        want = np.arange(3000) * (k + 1) + (bps.size() - 1) / 2   # the average of the ranks' r
        assert_array(a, want.astype(np.float32), f"tensor {k}", rtol=1e-6)


def scaling_and_reused_names():
    r, n = bps.rank(), bps.size()
    x = mx.nd.ones((3,)) * (r + 1)
    y = bps.allreduce(x, name="scaled", op=bps.Sum, prescale_factor=2.0, postscale_factor=0.5)
    assert_array(y, np.full(3, sum(k + 1 for k in range(n)), np.float32), "prescale 2 and postscale 0.5")
    # Integers scale in float64 and truncate toward zero, float16 in float32 (Horovod's rules).
    ints = bps.allreduce(mx.nd.array([5, -7, 3], dtype="int32"), name="scaled.int32", op=bps.Sum,
                         prescale_factor=0.5)
    assert_array(ints, np.array([2, -3, 1], np.int32) * n, "int32 prescale 0.5")
    longs = bps.allreduce(mx.nd.array([3, -4], dtype="int64"), name="scaled.int64", op=bps.Sum,
                          postscale_factor=0.3)
    assert_array(longs, np.trunc(np.array([3.0, -4.0]) * n * 0.3).astype(np.int64), "int64 postscale 0.3")
    halves = bps.allreduce(mx.nd.array([1.0, 3.0], dtype="float16"), name="scaled.f16", op=bps.Sum,
                           prescale_factor=1 / 3)
    assert_array(halves, (np.array([1.0, 3.0], np.float32) * np.float32(1 / 3)).astype(np.float16) * n,
                 "float16 prescale 1/3", rtol=1e-3)
    rows = bps.reducescatter(mx.nd.ones((2 * n, 2)) * (r + 1), name="scaled.rs", op=bps.Sum, prescale_factor=2.0,
                             postscale_factor=0.25)
    assert_array(rows, np.full((2, 2), 0.5 * sum(k + 1 for k in range(n)), np.float32),
                 "reducescatter prescale 2 and postscale 0.25")
    a = bps.allreduce(mx.nd.ones((3,)) * r, name="reused", average=False)
    b = bps.allreduce(mx.nd.ones((2, 2)) * r, name="reused", average=False)  # another shape: another tensor
    c = bps.allreduce(mx.nd.ones((3,)) * r, name="reused", average=False)
    s = sum(range(n))
    for got, shape in ((a, (3,)), (b, (2, 2)), (c, (3,))):
        assert_array(got, np.full(shape, s, np.float32), f"reused name, shape {shape}")
    unnamed = bps.allreduce(mx.nd.ones((2,)) * r)
    assert_array(unnamed, np.full(2, s / n, np.float32), "unnamed allreduce")


def errors():
    r = bps.rank()
    expect_error(ValueError, "unsupported dtype uint8", lambda: bps.byteps_push_pull(
        mx.nd.ones((2,), dtype="uint8"), name="u8"))
    expect_error(ValueError, "unsupported dtype bool", lambda: bps.allreduce(mx.np.ones((2,), dtype="bool")))
    expect_error(ValueError, "row_sparse", lambda: bps.allreduce(mx.nd.ones((2, 2)).tostype("row_sparse")))
    expect_error(TypeError, "expected an mxnet NDArray", lambda: bps.allreduce(np.ones(2)))
    # Adasum (Horovod's): (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b, over 2 ranks or a tree of pairs over 4
    level = [np.array([1.0, 2.0, -3.0, 0.5]) * (k + 1) + np.array([0, 1.0, 0, 0]) * k for k in range(bps.size())]
    mine = list(level)
    while len(level) > 1:
        level = [(1 - a @ b / (2 * a @ a)) * a + (1 - a @ b / (2 * b @ b)) * b for a, b in zip(level[::2], level[1::2])]
    want = level[0]
    got = bps.allreduce(mx.nd.array(mine[bps.rank()]), op=bps.Adasum, name="adasum").asnumpy()
    assert np.allclose(got, want, rtol=1e-6), (got, want)
    expect_error(NotImplementedError, "floating-point",
                 lambda: bps.allreduce(mx.nd.ones((2,), dtype="int32"), op=bps.Adasum))
    expect_error(ValueError, "root_rank", lambda: bps.broadcast(mx.nd.ones((2,)), root_rank=bps.size()))
    # Shapes that differ between ranks: the op fails on every rank, raised by MXNet from the read
    # of anything computed from its result (once: MXNet forgets an exception it has raised), or
    # under the NaiveEngine from the call.
    m = mx.nd.ones((3 + r,))
    if NAIVE:
        text = expect_error(mx.base.MXNetError, "push_pull('mismatch') failed",
                            lambda: bps.byteps_push_pull(m, name="mismatch"))
    else:
        bps.byteps_push_pull(m, name="mismatch")
        after = m + 1
        text = expect_error(mx.base.MXNetError, "push_pull('mismatch') failed", after.wait_to_read)
    low = r - bps.local_rank() if bps.local_size() > 1 else 0  # a machine's ranks meet first, and name their pair
    assert f"shape {3 + low}" in text and f"shape {4 + low}" in text, text
    n = mx.nd.ones((2 + r,))
    expect_error(mx.base.MXNetError, "allreduce('mismatch2') failed",
                 lambda: bps.allreduce(n, name="mismatch2").asnumpy())
    k = mx.nd.ones((2,)) * r  # and the job goes on
    bps.byteps_push_pull(k, name="after_mismatch", is_average=False)
    assert_array(k, np.full(2, sum(range(bps.size())), np.float32), "a push_pull after a failed one")


def main():
    bps.init()
    info()
    checks.run("push_pull float16/32/64 of rank 0-3, average and sum", push_pull_floats)
    checks.run("integers, mx.np arrays, zero-size", push_pull_integers_and_numpy_arrays)
    checks.run("broadcast of every dtype from both roots", broadcasts)
    if not NAIVE:
        checks.run("engine order: returns at once, waits for pending writes, later ops see results", engine_order)
    checks.run("ops of one name run in issue order", same_name_in_issue_order)
    if not NAIVE:  # there the group runs inside its call, and rank 0's barrier would wait for rank 1's push_pull
        checks.run("a fused group's bucket is numbered in issue order", fused_groups_keep_issue_order)
    checks.run("30 tensors with priorities", many_tensors_with_priorities)
    checks.run("scaling, reused and default names", scaling_and_reused_names)
    checks.run("errors: ValueError at the call, mismatches from MXNet on every rank", errors)
    mx.nd.waitall()
    bps.shutdown()
    checks.done()


if __name__ == "__main__":
    main()
