"""Worker script: Horovod's collectives beyond allreduce in byteps.tensorflow (allgather of any dtype,
alltoall, reducescatter, grouped allreduce, Min/Max/Product, narrow integers, objects, process sets,
mismatches as FailedPreconditionError, also inside graphs, and the job usable after them;
SyncBatchNormalization; the timeline), eagerly and inside tf.function, checked by every rank.

Run under bpslaunch with 2 ranks. Prints ``OK <check>`` per check and ``ALL OK <n>``.
"""

from __future__ import annotations

import json
import os

import numpy as np
import tensorflow as tf
from check_runner import Checks, assert_close, assert_equal, expect_error

import byteps.tensorflow as bps

checks = Checks()


def allgather_any_dtype():
    n, r = bps.size(), bps.rank()
    for dtype in (tf.uint8, tf.int8, tf.int16, tf.bool, tf.float16, tf.bfloat16, tf.float64, tf.int64):
        mine = tf.cast(tf.fill([r + 1, 2], r % 2 if dtype == tf.bool else r + 1), dtype)
        got = bps.allgather(mine, name=f"ag.{dtype.name}")
        want = tf.concat([tf.cast(tf.fill([k + 1, 2], k % 2 if dtype == tf.bool else k + 1), dtype)
                          for k in range(n)], axis=0)
        assert got.dtype == dtype, got.dtype
        assert_equal(got, want, f"allgather {dtype.name}")
    assert bps.allgather_object({"rank": r}) == [{"rank": k} for k in range(n)]
    with tf.Graph().as_default():   # objects need no tensors: the same in a TF1 graph
        assert bps.allgather_object(r, name="in.graph") == list(range(n))
        assert bps.broadcast_object(f"from {r}", root_rank=n - 1, name="in.graph") == f"from {n - 1}"
    parts = bps.grouped_allgather([tf.fill([1], r), tf.fill([r + 1], 1.0)], name="ag.grouped")
    assert_equal(parts[0], tf.range(n), "grouped allgather")


def alltoall_and_reducescatter():
    n, r = bps.size(), bps.rank()
    send = tf.concat([tf.fill([k + 1, 2], float(10 * r + k)) for k in range(n)], axis=0)
    got, received = bps.alltoall(send, splits=[k + 1 for k in range(n)], name="a2a")
    assert_equal(received, tf.fill([n], r + 1), "received splits")
    assert_equal(got, tf.concat([tf.fill([r + 1, 2], float(10 * k + r)) for k in range(n)], axis=0), "alltoall")
    rows = 2 * n + 1
    x = tf.reshape(tf.range(rows * 3) + r, [rows, 3])
    counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
    first = sum(counts[:r])
    total = sum(tf.reshape(tf.range(rows * 3) + k, [rows, 3]) for k in range(n))
    assert_equal(bps.reducescatter(x, op=bps.Sum, name="rs"), total[first:first + counts[r]], "reducescatter")
    scaled = bps.reducescatter(tf.ones([2 * n]), name="rs.avg", prescale_factor=4.0, postscale_factor=0.5)
    assert_equal(scaled, tf.fill([2], 2.0), "reducescatter average with scaling")
    expect_error(NotImplementedError, "Average or Sum", lambda: bps.reducescatter(tf.ones([n]), op=bps.Max))
    # grouped: each tensor scattered as reducescatter would (an integer Sum and a float Average, in order)
    widths = tf.reshape(tf.range(n * 2, dtype=tf.float32) * (r + 1), [n, 2])
    ints, floats = bps.grouped_reducescatter([x, widths], op=bps.Sum, name="rs.grouped")
    assert_equal(ints, total[first:first + counts[r]], "grouped reducescatter Sum (int32)")
    assert_equal(floats, tf.reshape(tf.range(n * 2, dtype=tf.float32), [n, 2])[r:r + 1] * (n * (n + 1) / 2),
                 "grouped reducescatter Sum (float32)")
    mean = bps.grouped_reducescatter([widths], name="rs.grouped.avg", postscale_factor=2.0)
    assert len(mean) == 1
    assert_equal(mean[0], tf.reshape(tf.range(n * 2, dtype=tf.float32), [n, 2])[r:r + 1] * (n + 1),
                 "grouped reducescatter Average, postscaled")


def ops_and_dtypes():
    n, r = bps.size(), bps.rank()
    x = tf.constant([float(r), -float(r), 2.0])
    assert_equal(bps.allreduce(x, op=bps.Min, name="min"), tf.constant([0.0, -(n - 1.0), 2.0]), "Min")
    assert_equal(bps.allreduce(x, op=bps.Max, name="max"), tf.constant([n - 1.0, 0.0, 2.0]), "Max")
    assert_equal(bps.allreduce(x + 1, op=bps.Product, name="prod"),
                 tf.constant([float(np.prod(np.arange(1, n + 1))), float(np.prod(1.0 - np.arange(n))), 3.0 ** n]),
                 "Product")
    narrow = bps.allreduce(tf.constant([100, 1], dtype=tf.int8), op=bps.Sum, name="int8")
    assert_equal(narrow, tf.constant(np.array([100 * n, n]).astype(np.int8)), "int8 sum wraps like int8")
    ints = bps.allreduce(tf.constant([3, 5]), op=bps.Sum, prescale_factor=0.5, name="int.scale")
    assert_equal(ints, tf.constant([n, 2 * n]), "integer prescale truncates")
    a, b = bps.grouped_allreduce([tf.ones(2), tf.ones([2, 2])], op=bps.Sum, name="grouped")
    assert_equal(a, tf.fill([2], float(n)), "grouped a")
    assert_equal(b, tf.fill([2, 2], float(n)), "grouped b")
    # IndexedSlices in a group are gathered (Horovod), the dense tensors reduced, in the caller's order
    rows = tf.IndexedSlices(tf.fill([1, 2], float(r + 1)), tf.constant([r]), dense_shape=tf.constant([n, 2]))
    dense, sliced = bps.grouped_allreduce([tf.ones(2), rows], op=bps.Sum, name="grouped.slices")
    assert isinstance(sliced, tf.IndexedSlices), type(sliced)
    assert_equal(tf.convert_to_tensor(sliced), tf.constant([[k + 1.0] * 2 for k in range(n)]), "grouped slices")
    assert_equal(dense, tf.fill([2], float(n)), "grouped dense beside slices")
    averaged = bps.grouped_allreduce([rows], name="grouped.slices.avg")[0]
    assert_equal(averaged.values, tf.constant([[k + 1.0] * 2 for k in range(n)]) / n, "grouped slices average")
    expect_error(NotImplementedError, "IndexedSlices", lambda: bps.grouped_allreduce([rows], op=bps.Max))


def inside_tf_function():
    n, r = bps.size(), bps.rank()

    @tf.function
    def step(x):
        return (bps.alltoall(x, name="f.a2a"), bps.allreduce(x, op=bps.Min, name="f.min"),
                bps.allreduce(x, op=bps.Max, name="f.max"), bps.allreduce(x, op=bps.Product, name="f.prod"),
                bps.reducescatter(x, op=bps.Sum, name="f.rs"), bps.allgather(x, name="f.ag"))

    for i in range(2):
        x = tf.range(2 * n, dtype=tf.float32) + r + i   # rank k's element j: j + k + i
        a2a, smallest, largest, product, scattered, gathered = step(x)
        j = np.arange(2 * n)
        assert_equal(smallest, tf.constant(j + i, tf.float32), "tf.function Min")
        assert_equal(largest, tf.constant(j + n - 1 + i, tf.float32), "tf.function Max")
        assert_equal(product, tf.constant(np.prod([j + k + i for k in range(n)], axis=0), tf.float32),
                     "tf.function Product")
        assert_equal(scattered, tf.constant([2.0 * r + j for j in range(2)]) * n + sum(range(n)) + n * i,
                     "tf.function reducescatter")
        # alltoall splits evenly: rank r gets elements 2r, 2r + 1 of every rank's tensor, in rank order
        assert_equal(a2a, tf.constant([2 * r + e + k + i for k in range(n) for e in range(2)], tf.float32),
                     "tf.function alltoall")
        assert_equal(gathered, tf.constant([e + k + i for k in range(n) for e in range(2 * n)], tf.float32),
                     "tf.function allgather")


def gradients():
    n = bps.size()
    x = tf.ones([n * 2, 2])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = bps.alltoall(x, name="grad.a2a")
        loss = tf.reduce_sum(y * 3.0)
    assert_equal(tape.gradient(loss, x), tf.fill([n * 2, 2], 3.0), "alltoall gradient")
    with tf.GradientTape() as tape:
        tape.watch(x)
        a, b = bps.grouped_allreduce([x, x * 2.0], op=bps.Sum, name="grad.grouped")
        loss = tf.reduce_sum(a) + tf.reduce_sum(b)
    assert_equal(tape.gradient(loss, x), tf.fill([n * 2, 2], 3.0 * n), "grouped allreduce gradient")


def process_sets():
    n, r = bps.size(), bps.rank()
    sets = [bps.add_process_set([k]) for k in range(n)]   # every rank adds the same sets in the same order
    mine = sets[r]                                          # a set of one: nothing waits for the other ranks
    assert_equal(bps.allreduce(tf.fill([2], float(r)), op=bps.Sum, name="ps", process_set=mine),
                 tf.fill([2], float(r)), "set allreduce")
    assert_equal(bps.allgather(tf.fill([1], r), name="ps.ag", process_set=mine), tf.fill([1], r), "set allgather")
    assert_equal(bps.broadcast(tf.fill([1], float(r)), r, name="ps.bc", process_set=mine), tf.fill([1], float(r)),
                 "set broadcast")
    bps.barrier(process_set=mine)
    other = sets[(r + 1) % n]
    expect_error(ValueError, "is not in", lambda: bps.allreduce(tf.ones(1), name="x", process_set=other))
    expect_error(ValueError, "exists already", lambda: bps.add_process_set([r]))
    for process_set in sets:
        assert bps.remove_process_set(process_set)
    bps.barrier()


def mismatches():
    r = bps.rank()
    text = expect_error(tf.errors.FailedPreconditionError, "shape after the first dimension",
                        lambda: bps.allgather(tf.ones([2, 3 + r]), name="bad.cols"))
    assert "rank 0 has (3,)" in text and "rank 1 has (4,)" in text, text
    expect_error(bps.PushPullError, "broadcasts from rank",
                 lambda: bps.broadcast(tf.ones(3), root_rank=r, name="bad.root"))
    # Inside graphs the class is kept too (Horovod's FailedPreconditionError), not TensorFlow's UnknownError.
    fn = tf.function(lambda t: bps.allgather(t, name="bad.cols.fn"))
    expect_error(tf.errors.FailedPreconditionError, "shape after the first dimension", lambda: fn(tf.ones([2, 3 + r])))
    with tf.Graph().as_default():
        summed = bps.allreduce(tf.ones([3 + r]), op=bps.Sum, name="bad.graph")
        with tf.compat.v1.Session() as session:
            expect_error(tf.errors.FailedPreconditionError, "shape", lambda: session.run(summed))
    # the failed rounds leave the job usable: the next collectives and a barrier work on every rank
    n = bps.size()
    assert_equal(bps.allgather(tf.fill([1, 3], r), name="after.bad"), tf.constant([[k] * 3 for k in range(n)]),
                 "allgather after the mismatches")
    assert_equal(fn(tf.fill([1, 3], float(r))), tf.constant([[float(k)] * 3 for k in range(n)]),
                 "the failed tf.function again, with matching shapes")
    bps.barrier()


def sync_batch_normalization():
    """Uneven batches (rank k has 3 + 2k rows): outputs, input and weight gradients, moving statistics
    equal Keras's BatchNormalization on the whole global batch, eagerly and in tf.function."""
    import keras
    n, r = bps.size(), bps.rank()
    rows = [3 + 2 * k for k in range(n)]
    start = sum(rows[:r])
    everything = tf.constant(np.random.default_rng(7).normal(2.0, 3.0, (sum(rows), 4)), tf.float32)
    upstream = tf.constant(np.random.default_rng(8).normal(size=(sum(rows), 4)), tf.float32)
    mine, my_upstream = everything[start:start + rows[r]], upstream[start:start + rows[r]]

    def run(layer, x, w, traced):
        def forward(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = layer(x, training=True)
                loss = tf.reduce_sum(y * w)
            dx, dgamma, dbeta = tape.gradient(loss, [x, layer.gamma, layer.beta])
            return y, dx, dgamma, dbeta
        return tf.function(forward)(x) if traced else forward(x)

    for traced in (False, True):
        reference = keras.layers.BatchNormalization(momentum=0.5)
        synced = bps.SyncBatchNormalization(momentum=0.5, name=f"sync_bn_{int(traced)}")
        y, dx, dgamma, dbeta = run(reference, everything, upstream, traced)
        y_mine, dx_mine, dgamma_mine, dbeta_mine = run(synced, mine, my_upstream, traced)
        what = "tf.function" if traced else "eager"
        assert_close(y_mine, y[start:start + rows[r]], f"{what}: output", atol=1e-4)
        assert_close(dx_mine, dx[start:start + rows[r]], f"{what}: input gradient", atol=1e-4)
        assert_close(bps.allreduce(dgamma_mine, op=bps.Sum, name=f"dgamma.{what}"), dgamma, f"{what}: gamma", atol=1e-4)
        assert_close(bps.allreduce(dbeta_mine, op=bps.Sum, name=f"dbeta.{what}"), dbeta, f"{what}: beta", atol=1e-4)
        assert_close(synced.moving_mean, reference.moving_mean, f"{what}: moving mean", atol=1e-5)
        assert_close(synced.moving_variance, reference.moving_variance, f"{what}: moving variance", atol=1e-4)
    expect_error(ValueError, "fused=True", lambda: bps.SyncBatchNormalization(fused=True))


def build_flags():
    assert not any(f() for f in (bps.mpi_built, bps.gloo_built, bps.nccl_built, bps.cuda_built))


def uneven_join():
    """Rank r runs 2 + r steps; a joined rank counts as zeros; then every rank agrees on a new tensor."""
    r, n = bps.rank(), bps.size()
    for step in range(2 + r):
        y = bps.allreduce(tf.fill([3], float(r + 1)), op=bps.Sum, name="uneven")
        assert_equal(y, tf.fill([3], float(sum(k + 1 for k in range(n) if 2 + k > step))), f"step {step}")
        bps.allreduce(tf.ones([2]), op=bps.Sum)   # unnamed: counters differ until the join
    assert bps.join() == n - 1
    y = bps.allreduce(tf.fill([2], float(r)), op=bps.Sum)
    assert_equal(y, tf.fill([2], float(sum(range(n)))), "unnamed allreduce after join")
    # inside a tf.function join is an op that joins each time the function runs, not once when traced
    step = tf.function(lambda: bps.allreduce(tf.fill([2], float(r + 1)), op=bps.Sum, name="fn.uneven"))
    joined = tf.function(bps.join)
    for _ in range(2):
        for k in range(1 + r):
            assert_equal(step(), tf.fill([2], float(sum(q + 1 for q in range(n) if 1 + q > k))), f"fn step {k}")
        assert int(joined()) == n - 1


def timeline():
    """start_timeline .. stop_timeline around eager and tf.function allreduces: rank 0 writes a Chrome trace
    naming the tensors reduced inside the window, and only those."""
    path = os.path.join(os.environ["BYTEPS_TEST_TMP"], "timeline.json")
    expect_error(ValueError, "file_path must not be empty", lambda: bps.start_timeline(""))
    bps.start_timeline(path)
    traced = tf.function(lambda t: bps.allreduce(t, op=bps.Sum, name="timeline.fn"))
    for _ in range(2):
        bps.allreduce(tf.ones([1000]), name="timeline.eager")
        traced(tf.ones([10]))
    bps.stop_timeline()
    bps.allreduce(tf.ones([1000]), name="timeline.after")
    bps.barrier()
    if bps.rank() != 0:
        return   # Horovod's rank 0 alone writes the timeline
    with open(path) as handle:
        spans = [e for e in json.load(handle)["traceEvents"] if e["ph"] == "X"]
    tensors = [e["name"] for e in spans if e["cat"] == "tensor"]
    assert sum("timeline.eager" in name for name in tensors) == 2, tensors
    assert sum("timeline.fn" in name for name in tensors) == 2, tensors
    assert not any("timeline.after" in e["name"] for e in spans), spans


def main():
    bps.init()
    checks.run("allgather of any dtype, objects, grouped", allgather_any_dtype)
    checks.run("alltoall and reducescatter", alltoall_and_reducescatter)
    checks.run("Min/Max/Product, narrow integers, integer scaling, grouped allreduce", ops_and_dtypes)
    checks.run("inside tf.function", inside_tf_function)
    checks.run("gradients", gradients)
    checks.run("process sets", process_sets)
    checks.run("mismatches", mismatches)
    checks.run("SyncBatchNormalization", sync_batch_normalization)
    checks.run("build flags", build_flags)
    checks.run("timeline", timeline)
    checks.run("join with uneven data", uneven_join)
    bps.shutdown()
    checks.done()


if __name__ == "__main__":
    main()
